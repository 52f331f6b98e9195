"""Tables the tests read from the registry."""

import itertools

from trl_entropy.methods import METHODS, combination


# A metric only the method logs (the first it declares; the base's own for plain GRPO): the run went through that
# method's trainer and settings.
METHOD_METRIC = {
    name: method.metrics[0].key if method.metrics else "entropy/cov_logp_adv" for name, method in METHODS.items()
}


def first_combinable_pair(names) -> str:
    """The first two of ``names`` that combine (different axes), joined as ``--method`` joins them."""
    for pair in itertools.combinations(names, 2):
        try:
            return combination(list(pair)).key
        except ValueError:
            continue
    raise AssertionError(f"no two of {names} combine")
