"""The command-line programs behind ``trl-entropy train``, ``report``, ``demo`` and ``fetch-model``
(:mod:`trl_entropy.cli`): each parses its arguments and calls the library."""
