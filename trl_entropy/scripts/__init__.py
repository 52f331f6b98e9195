"""The command-line programs behind ``trl-entropy train``, ``trl-entropy report`` and ``trl-entropy demo``
(:mod:`trl_entropy.cli`): each parses its arguments and calls the library."""
