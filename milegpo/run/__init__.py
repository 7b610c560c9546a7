"""The application layer: a :class:`~milegpo.run.config.TrainConfig` in, a run folder out.

``config.py`` holds the run's settings (the one source of the CLI's flags and their checks),
``train.py`` builds the env, model and callbacks and trains (resuming a killed run),
``logs.py`` keeps the run folder's logs whole across resumes, ``tracking.py`` writes to
W&B / MLflow, ``plots.py`` draws the run's figures and ``export.py`` writes the adapter or a
merged model. The names of the files in a run folder are in :mod:`milegpo.run_folder`.
"""
