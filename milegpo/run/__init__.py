"""The application layer: a :class:`~milegpo.config.run.TrainConfig` in, a run folder out.

``plan.py`` checks the settings once and derives the run's plan from them (env arguments and
task seeds per split, the base model, the run folder, the rank), ``train.py`` builds the env,
model and callbacks from the plan and trains, ``resume.py`` opens the run folder (new, or resumed
from its newest intact checkpoint), ``finish.py`` ends a run (final evaluation, plots) and loads a
finished one, ``checks.py`` holds the checks that need the env registry, the model files or torch,
``logs.py`` keeps the run folder's logs whole across resumes, ``lock.py`` lets one process write a
run folder, ``tracking.py`` writes to W&B / MLflow, ``plots.py`` draws the run's figures and
``export.py`` writes the adapter or a merged model. The settings themselves are
:mod:`milegpo.config.run`; the names of the files in a run folder are in :mod:`milegpo.run_folder`.
"""
