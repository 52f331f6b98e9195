"""Everything this library knows of TRL, in one package: the supported versions (``pin``, which ``setup.py`` reads),
the one module that touches TRL's and Trainer's private names (``bridge``) and the guards of every such name
(``drift``), TRL's math restated (``surrogates``, ``objectives``, ``advantages``, ``metrics``), and what other
packages print that a user cannot act on (``noise``: warning filters for our entry points, the log lines we read).
A TRL upgrade touches this package and nothing else."""
