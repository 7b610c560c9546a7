"""The verl-agent modules milegpo patches, by name: :mod:`~milegpo.integrations.verl.hook` watches for the
trainer module's import and :mod:`~milegpo.integrations.verl.install` patches both.

Names only, with no import at all: the Ray worker hook, which must stay light enough for every worker,
reads them.
"""

#: where verl-agent's trainer lives
TRAINER_MODULE = "verl.trainer.ppo.ray_trainer"
#: where verl-agent's collector lives
COLLECTOR_MODULE = "agent_system.multi_turn_rollout.rollout_loop"
