"""Tables the tests read from the registry."""

from trl_entropy.methods import METHODS


# A metric only the method logs (the first it declares; the base's own for plain GRPO): the run went through that
# method's trainer and settings.
METHOD_METRIC = {
    name: method.metrics[0].key if method.metrics else "entropy/cov_logp_adv" for name, method in METHODS.items()
}
