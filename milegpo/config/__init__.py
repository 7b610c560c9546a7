"""The settings of milegpo's objects, one frozen dataclass per object, torch-free.

:class:`PolicyConfig` (with :class:`LoraConfig` and :class:`SamplerConfig`) is what
:class:`~milegpo.policies.LLMPolicy` takes, :class:`AlgoConfig` what the algorithms take,
:class:`WarmStartConfig` what the supervised warm start takes. A run's
:class:`~milegpo.config.run.TrainConfig` composes them. Each checks its values when built.
"""

from milegpo.config.algo import AlgoConfig
from milegpo.config.fields import from_dict
from milegpo.config.policy import LoraConfig, PolicyConfig, SamplerConfig
from milegpo.config.tiny_model import TinyModelConfig
from milegpo.config.warm_start import WarmStartConfig

__all__ = ["AlgoConfig", "LoraConfig", "PolicyConfig", "SamplerConfig", "TinyModelConfig", "WarmStartConfig",
           "from_dict"]
