"""Fixtures shared by the test files.

``model_path``: the tiny offline LM on the House env's vocabulary (hidden size 32, one
layer, two heads: the CPU demo's size), built once per session. torch runs on one thread
in the test process: the suite must hold on a 2-core machine that runs other torch jobs
beside it (the tests that start subprocesses set ``OMP_NUM_THREADS`` themselves).
"""

from __future__ import annotations

import pytest
import torch as th

from milegpo.envs.house import HouseEnv
from milegpo.policies import tiny_model


@pytest.fixture(scope="session")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    th.set_num_threads(1)
    return tiny_model(HouseEnv.vocabulary(), tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1, num_heads=2)


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: the suite shares 2 cores with other jobs (oversubscribed, a model's
    generation is ~20x slower)."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)
