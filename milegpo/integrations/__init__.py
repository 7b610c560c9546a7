"""MileGPO credit and environments inside other trainers.

* :mod:`milegpo.integrations.verl` - the credit functions (MileGPO, GraphGPO, HGPO,
  GiGPO, RLOO, GRPO) as advantage estimators of verl / verl-agent's PPO trainer, on
  its step-level batch layout (``DataProto``).

Each module imports its trainer only when it is used; none is needed to import milegpo.
"""
