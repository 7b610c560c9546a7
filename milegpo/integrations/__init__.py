"""MileGPO credit and environments inside other trainers.

* :mod:`milegpo.integrations.verl` - the credit functions (MileGPO, GraphGPO, HGPO,
  GiGPO, RLOO, GRPO) as advantage estimators of verl / verl-agent's PPO trainer, on
  its step-level batch layout (``DataProto``).
* :mod:`milegpo.integrations.skyrl_gym` - SkyRL's text environments (``skyrl-gym``) as
  milegpo :class:`~milegpo.envs.TextEnv` s, over the rows of a SkyRL data set.

Each module imports its trainer or env package only when it is used; none is needed to import milegpo.
"""
