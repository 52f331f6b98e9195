"""One process standing in for one rank of a larger world: the quick loop's check of what a two-process run sums over
its ranks (the launch tests run the real thing)."""

import torch


class StandInRank:
    """A trainer's accelerator as rank ``process_index`` of ``num_processes``, in one process: ``reduce(..., "sum")``
    adds ``others``, what the other ranks would contribute to the all-reduce (a list: one tensor per all-reduce, in
    the order they come, each used once); everything else is the real accelerator's. Install it with
    ``monkeypatch.setattr(trainer, "accelerator", StandInRank(...))``."""

    def __init__(self, accelerator, process_index: int, num_processes: int, others: torch.Tensor | list[torch.Tensor]):
        self.accelerator = accelerator
        self.process_index = process_index
        self.num_processes = num_processes
        self.others = others

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        assert reduction == "sum", f"the stand-in sums only, not {reduction!r}"
        others = self.others.pop(0) if isinstance(self.others, list) else self.others
        assert tensor.shape == others.shape, (tensor.shape, others.shape)
        return tensor + others.to(tensor)

    def __getattr__(self, name: str):
        return getattr(self.accelerator, name)
