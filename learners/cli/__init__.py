"""The ``angelps`` command line: train | predict | evaluate | schedule | conf | plot.

:mod:`learners.cli.main` builds the parser from the verb modules and turns errors into exit
codes; each verb module (:mod:`~learners.cli.train`, :mod:`~learners.cli.schedule`,
:mod:`~learners.cli.plot`, :mod:`~learners.cli.conf`) registers its sub-commands. The
``angelps`` console script and ``python -m angelps`` run :func:`learners.cli.main.main`.

Invariant: building the parser and running the config-only verbs (``conf``, ``schedule``,
``--help``, a mistyped key's error) import neither torch nor Ray; the verbs that train or
predict import the learner when they run.
"""
