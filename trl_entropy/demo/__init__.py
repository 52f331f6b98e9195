"""The entropy-collapse demo behind ``trl-entropy demo`` (examples/entropy_collapse_demo.py describes what it runs):

* :mod:`.arguments`: the demo's flags, each run's settings from its YAML config;
* :mod:`.models`: the policies runs start from (``--model``: the toy policy, or SmolLM2-135M-Instruct), their tasks
  and training recipes;
* :mod:`.jobs`: one job, training and evaluating one policy;
* :mod:`.scheduler` and :mod:`.worker`: the jobs in this process or in worker processes;
* :mod:`.summary` and :mod:`.tables`: the runs' summaries, the bootstrap intervals, the tables;
* :mod:`.figure`: ``entropy_collapse.png`` (and, for a pretrained model, each seed's ``trl-entropy report``);
* :mod:`.provenance`: versions, machine and commit in ``history.json``;
* :mod:`.run`: the whole demo (:func:`~trl_entropy.demo.run.run_demo`) and the outputs computed from ``history.json``
  (:func:`~trl_entropy.demo.run.write_outputs`).
"""
