"""Credit quality against ground truth, and the paper's tie statistics, on four envs.

The learning benchmark measures credit *through* a tiny learner, which adds its own
noise. Here each method's advantages are scored directly against the truth. For
every env a tracker (:mod:`ground_truth`) gives ``d*(s)``, the steps an optimal
agent still needs to win (House: BFS; TWX coin: the explored map; WebShop: the
purchase funnel; ALFWorld: alfworld's fast-downward planner); a state that cannot
win any more gets ``horizon + 1``. The true quality of a step is its progress
``q_t = d*(s_t) - d*(s_{t+1})``.

Groups of ``K`` rollouts per task are played by the uniform random policy over the
admissible commands (what an untrained agent does); with ``--epsilon``, by a mixture
of the env's scripted expert and that random policy (structured rollouts, closer to a
pretrained agent's, where milestones recur across the group); or, with ``--warm-start``,
by the policy a warm-start learning run starts from (``learning_efficiency.py
--warm-start``: the same model, recipe and seed, sampled at temperature 1 as in training; a
task's rollouts are played in lockstep, one batched policy call per step, each sample from its
own seeded generator; ``--policy-cache DIR`` keeps each (env, seed)'s policy for later runs).
Each method's advantages are scored on them, over the tasks with at least one success
(without one every method gives zero step-level credit):

* **pairwise accuracy**: over pairs of steps taken from the *same state* of the same
  task whose true progress differs, the share the advantage orders the same way
  (ties count one half; 0.5 = no information): the choice a policy gradient learns.
* **weighted agreement**: ``sum(dA * sign(dq)) / sum(|dA|)`` over the same pairs, in
  [-1, 1]: each pair weighs by how far apart the advantages put it (what the
  gradient sees; a tie broken by 1e-9 counts for nothing).
* **trap credit**: mean advantage (in advantage-std units) of steps that make the
  task unwinnable or set it back 3 or more steps, minus that of the other steps
  taken from the same states.

**Two regimes** (``--state-key``, one or both). Every step is played once and its state read
under two keys: ``env``, the env's own key (:meth:`TextEnv.state_key`, this library's default:
House's and ALFWorld's world state, WebShop's page with its chosen options), and
``observation``, the observation text exactly as the MileGPO paper's and verl-agent's code group
steps (:meth:`TextEnv.anchor_observation`, what an env made with ``state_key="observation"``
puts in ``info``; WebShop in verl-agent's anchor format). The credit methods group steps by the
chosen key; the truth does not change with it: the same-state pairs, ``d*`` and the trap steps
are always the true state's (the env's own key and the tracker), so both regimes are scored
against the same truth on the same rollouts. In the ``observation`` regime a text printed by
several true states merges them (one node for the graph methods) and a true state printed with
several texts is split; the key statistics report both (``merged_steps``: share of the scored
steps whose key covers two or more true states of the task; ``split_steps``: whose true state
has two or more keys).

**Breakdown: where MileGPO departs from GraphGPO, and whether toward the truth.** Each component
is measured as the difference between two credits, the variant with it and the same variant
without it (:data:`COMPONENTS`): MileGPO against GraphGPO (all components), against MileGPO with
``w_plus=0`` (milestone bonus), ``traps=False`` (trap penalty), ``pcc=False`` (PCC); and RCS as
MileGPO without PCC against MileGPO with uniform milestone detection (``rcs=False``; PCC
re-scores RCS's scores, so it is off on both sides). A same-state pair's score under a credit is
1 if the credit orders its two steps as the true progress does, 0.5 on a tie, 0 the wrong way
(pairwise accuracy is their mean). A pair is *changed* by the component when the two credits'
scores differ (the order flips, or a tie is made or broken), *toward* the truth when the
credit with the component scores it higher, *away* otherwise; ``net`` sums the score
differences, so ``net / pairs`` over all pairs is exactly the component's change of pairwise
accuracy, and it splits over the pair types. Each pair gets the first type that applies:

* **trap**: one of its two steps is a trap step (above: the task becomes unwinnable, or is set
  back 3 or more steps);
* **branching point**: one step is of a successful rollout and the other of a failed one (the
  state where the group's actions, and outcomes, part);
* **successful path**: a successful rollout of the task visited the (true) state;
* **off path**: the state only failed rollouts visited.

The tables give per component, regime and type the share of the changed pairs moved toward the
truth, how many changed (summed over seeds) and ``net / pairs``.

**Paper statistics** (MileGPO's Figures 4 and 9; ``credit/diagnostics.py``): the
share of transitions leaving a state two trajectories visit, the share of
same-source, distinct-action pairs GraphGPO ties, the share of those MileGPO
separates (with RCS and with uniform milestone detection), and how often the
separation points the right way where the truth differs.

Five MileGPO options beyond the paper ("(ours)" rows of the committed results: relative
residual, signed traps, dead-end traps, no shaping without success, residual on GraphGPO
ties only) were measured with this script at commit 6488955; none was no worse than
GraphGPO on every env and ahead somewhere, so they were dropped from the library.

    python -m benchmarks.credit.credit_quality                      # all envs, seeds 0-4
    # + HGPO, RLOO:
    python -m benchmarks.credit.credit_quality --out benchmarks/results/credit_quality_hgpo_rloo --seeds 0 1 2 3 4
    python -m benchmarks.credit.credit_quality --envs house --seeds 0
    python -m benchmarks.credit.credit_quality --epsilon 0.5 \
        --out benchmarks/results/credit_quality_mixture_e50             # structured groups
    python -m benchmarks.credit.credit_quality --warm-start \
        --out benchmarks/results/credit_quality_warm_start              # the warm-started learner's groups
        # (the committed file's were sampled one rollout at a time, by this script at commit c540d33)
    # both regimes in one file, as committed (processes of other envs, seeds or groups, e.g. with
    # --warm-start, may fill the same file at the same time; each seed is filed when done):
    R="--state-key env observation --out benchmarks/results/credit_quality_regimes"
    python -m benchmarks.credit.credit_quality --envs alfworld --tasks 16 $R
    python -m benchmarks.credit.credit_quality --envs house coin --tasks 50 $R
    python -m benchmarks.credit.credit_quality --envs webshop --tasks 30 $R
    W="--warm-start --policy-cache /tmp/credit_quality_policies"     # the warm-started groups, same tasks
    python -m benchmarks.credit.credit_quality --envs house coin --tasks 50 $W $R
    python -m benchmarks.credit.credit_quality --envs webshop --tasks 30 $W $R
    python -m benchmarks.credit.credit_quality --envs alfworld --tasks 16 $W $R
    python -m benchmarks.credit.credit_quality --tables-only --out benchmarks/results/credit_quality_regimes
"""

from __future__ import annotations

import fcntl
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.credit import ground_truth
from benchmarks.learning import learning_efficiency
from milegpo.credit import StepBatch, build_task_graph, compute_credit
from milegpo.credit.diagnostics import tied_pairs

#: (label, credit method, config overrides); MileGPO rows add the env's preset.
VARIANTS = [
    ("GRPO", "grpo", {}),
    ("RLOO", "rloo", {}),
    ("GiGPO", "gigpo", {}),
    ("HGPO", "hgpo", {}),
    ("GraphGPO", "graphgpo", {}),
    ("GraphGPO gamma_G=0.1 (upstream ALFWorld)", "graphgpo", {"gamma_g": 0.1}),
    ("MileGPO", "milegpo", {}),
    ("MileGPO eta=1", "milegpo", {"eta": 1.0}),
    ("MileGPO no RCS (uniform MD)", "milegpo", {"rcs": False}),
    ("MileGPO no PCC", "milegpo", {"pcc": False}),
    ("MileGPO no BCC", "milegpo", {"bcc": False}),
    ("MileGPO no local progress", "milegpo", {"local_progress": False}),
    ("MileGPO no traps", "milegpo", {"traps": False}),
    ("MileGPO no milestone bonus", "milegpo", {"w_plus": 0.0}),
    ("GAGPO", "gagpo", {}),
    ("G2PO", "g2po", {}),
    ("G2PO mean_std_norm (the authors' ALFWorld / WebShop scripts)", "g2po", {"norm": "mean_std_norm"}),
]
PRESET = {"webshop": "webshop"}  # MileGPO's per-env preset; the others use the ALFWorld (default) one

#: The regimes (``--state-key``): the key the credit methods group steps by.
STATE_KEYS = ("env", "observation")

#: The breakdown's contrasts: (component, the variant with it, the same variant without it).
COMPONENTS = [
    ("all (MileGPO vs GraphGPO)", "MileGPO", "GraphGPO"),
    ("milestone bonus", "MileGPO", "MileGPO no milestone bonus"),
    ("trap penalty", "MileGPO", "MileGPO no traps"),
    ("PCC", "MileGPO", "MileGPO no PCC"),
    ("RCS", "MileGPO no PCC", "MileGPO no RCS (uniform MD)"),
]

#: The types of a same-state pair (:func:`pair_types`).
STATE_TYPES = ("successful path", "branching point", "trap", "off path")

#: The MileGPO paper's statistics, for the side-by-side table.
PAPER = {"shared_state_share": "≈ 0.74", "tie_share": "0.544 ALFWorld, 0.727 WebShop",
         "ties_broken_rcs": "0.265", "ties_broken_uniform": "0.170"}


#: actor(rng, env, observation, info, history) -> the command to play.
Actor = Callable[[random.Random, object, str, dict, list], str]


def random_actor(rng: random.Random, env, observation: str, info: dict, history: list) -> str:
    return rng.choice(info["admissible_commands"])


def mixture_actor(epsilon: float) -> Actor:
    """The env's scripted expert (``env.expert_action()``) with probability ``1 - epsilon``, else random."""
    def act(rng: random.Random, env, observation: str, info: dict, history: list) -> str:
        expert = env.expert_action() if rng.random() >= epsilon else None
        return expert if expert is not None else rng.choice(info["admissible_commands"])
    return act


def warm_started_policy(env_name: str, seed: int, workdir: Path):
    """The policy that ``learning_efficiency.py --warm-start`` runs of ``env_name`` and ``seed`` start from.

    Built (its tiny LM, then the behaviour cloning) in ``workdir/ENV-sSEED`` and saved there with
    the policy's own :meth:`~milegpo.policies.LLMPolicy.save`, beside the settings it was built
    from: a later call, in this process or another, with the same folder and settings loads it
    instead of cloning again (``--policy-cache``; a lock keeps two processes from building one
    policy at the same time). Torch runs on one thread, as the learning benchmark's runs do: on a
    shared, loaded CPU a second intra-op thread used as much CPU time as the main one (seen in
    the warm start's behaviour cloning), time taken from the other processes."""
    import torch

    from milegpo.policies import LLMPolicy
    from milegpo.run.train import run_base_model

    torch.set_num_threads(1)
    values = learning_efficiency.warm_start_values(env_name, seed)
    config = learning_efficiency.make_config(values)
    folder = workdir / f"{env_name}-s{seed}"
    saved, settings = folder / "policy", folder / "warm_start_values.json"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if settings.exists() and json.loads(settings.read_text()) == values:
            policy = LLMPolicy.load(saved, device="cpu", model=run_base_model(config, folder))
        else:
            policy = learning_efficiency.starting_model(config, folder).policy
            policy.save(saved)
            harness.write_json(settings, values)
    policy.reseed_sampling(seed)
    return policy


@dataclass
class Groups:
    """``K`` rollouts per task, each state under both keys, and the true distances of every step.

    ``keys["env"]`` is the env's own key (:meth:`TextEnv.state_key`: the true state, the ground
    truth's key); ``keys["observation"]`` the paper's (:meth:`TextEnv.anchor_observation`, what
    ``state_key="observation"`` puts in ``info``). Both are per trajectory ``s_0 .. s_T``.
    """

    keys: dict[str, list[list[str]]]
    success: list[bool]
    task_ids: list[int]
    actions: list[list[str]]
    rewards: list[list[float]]
    valid: list[list[bool]]
    dist: np.ndarray  # (N,) d*(s_t), horizon + 1 where the task cannot be won any more
    next_dist: np.ndarray  # (N,) d*(s_{t+1})
    horizon: int

    def batch(self, state_key: str = "env") -> StepBatch:
        """The step batch the credit methods see, its states keyed by ``state_key`` (:data:`STATE_KEYS`)."""
        return StepBatch.from_trajectories(self.keys[state_key], self.success, task_ids=self.task_ids,
                                           actions=self.actions, rewards=self.rewards, valid=self.valid)

    def on_successful_path(self) -> np.ndarray:
        """(N,) whether a successful rollout of the task visited the step's true state."""
        visited = {(task, key) for task, keys, won in zip(self.task_ids, self.keys["env"], self.success) if won
                   for key in keys}
        return np.array([(task, key) in visited for task, keys in zip(self.task_ids, self.keys["env"])
                         for key in keys[:-1]], dtype=bool)


@dataclass
class Rollout:
    """One episode in play: its env and tracker, its last observation and info, and what
    :class:`Groups` keeps of it (each state under both keys, ``d*`` of each state)."""

    env: object
    tracker: ground_truth.Tracker
    observation: str
    info: dict
    states: list[str]
    texts: list[str]
    dists: list[int | None]
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    valid: list[bool] = field(default_factory=list)
    history: list[tuple[str, str]] = field(default_factory=list)
    done: bool = False

    @classmethod
    def start(cls, env, tracker: ground_truth.Tracker, task_seed: int) -> Rollout:
        """Reset ``env`` to the task of ``task_seed`` and read its first state."""
        observation, info = env.reset(seed=task_seed)
        tracker.observe(None, info)
        return cls(env=env, tracker=tracker, observation=observation, info=info, states=[info["state_key"]],
                   texts=[env.anchor_observation()], dists=[tracker.distance(info)])

    def step(self, action: str) -> None:
        """Play ``action`` and record the step and the state it leads to."""
        self.history.append((self.observation, action))
        self.observation, reward, terminated, truncated, self.info = self.env.step(action)
        self.tracker.observe(action, self.info)
        self.done = terminated or truncated
        self.states.append(self.info["state_key"])
        self.texts.append(self.env.anchor_observation())
        self.actions.append(action)
        self.rewards.append(reward)
        self.valid.append(self.info["valid_action"])
        self.dists.append(self.tracker.distance(self.info))


def as_groups(played: list[tuple[int, Rollout]], horizon: int) -> Groups:
    """The groups of finished rollouts, each with its task's index, in the order given."""
    unsolvable = horizon + 1
    distances = [[unsolvable if d is None else d for d in rollout.dists] for _, rollout in played]
    return Groups(keys={"env": [r.states for _, r in played], "observation": [r.texts for _, r in played]},
                  success=[bool(r.info.get("won")) for _, r in played], task_ids=[task for task, _ in played],
                  actions=[r.actions for _, r in played], rewards=[r.rewards for _, r in played],
                  valid=[r.valid for _, r in played],
                  dist=np.concatenate([d[:-1] for d in distances]).astype(float),
                  next_dist=np.concatenate([d[1:] for d in distances]).astype(float), horizon=horizon)


def play_groups(env_name: str, n_tasks: int, group_size: int, seed: int, actor: Actor = random_actor) -> Groups:
    """Groups on the env's train tasks played by ``actor``, with d*(s_t) and d*(s_{t+1}) of every step.

    The rollouts are played one after the other on one env, with one tracker per task, so the
    random and mixture actors draw exactly the random numbers they always did for a seed; both
    keys are read from the same rollouts, so the two regimes are scored on the same steps.
    """
    env, tracker_factory = ground_truth.make(env_name, expert=actor is not random_actor)
    horizon = env.max_episode_steps
    rng = random.Random(seed)
    played: list[tuple[int, Rollout]] = []
    for task, task_seed in enumerate(rng.sample(range(env.num_tasks), min(n_tasks, env.num_tasks))):
        tracker = tracker_factory(env, task_seed)
        for _ in range(group_size):
            rollout = Rollout.start(env, tracker, task_seed)
            while not rollout.done:
                rollout.step(actor(rng, env, rollout.observation, rollout.info, rollout.history))
            played.append((task, rollout))
    env.close()
    return as_groups(played, horizon)


def sample_seed(seed: int, task: int, copy: int, step: int) -> int:
    """The seed of one policy sample: its own per (seed, task, copy in the group, step), so a
    seed's groups do not depend on which rollouts share a batched policy call."""
    return int(np.random.SeedSequence([seed, task, copy, step]).generate_state(1)[0])


def play_policy_groups(env_name: str, n_tasks: int, group_size: int, seed: int, policy) -> Groups:
    """Groups sampled from ``policy`` (an :class:`~milegpo.policies.LLMPolicy`, temperature 1) on the
    tasks :func:`play_groups` draws for ``seed``, with the same records.

    A task's ``group_size`` rollouts are played in lockstep on as many copies of the env, each
    with its own tracker, and the policy is called once per step for all unfinished rollouts:
    one batched forward pass instead of one per rollout. Each rollout's action is drawn from the
    generator of its :func:`sample_seed`, so a seed's groups are reproducible."""
    made = [ground_truth.make(env_name) for _ in range(group_size)]
    envs, tracker_factory = [env for env, _ in made], made[0][1]
    horizon = envs[0].max_episode_steps
    tasks = random.Random(seed).sample(range(envs[0].num_tasks), min(n_tasks, envs[0].num_tasks))
    played: list[tuple[int, Rollout]] = []
    for task, task_seed in enumerate(tasks):
        rollouts = [Rollout.start(env, tracker_factory(env, task_seed), task_seed) for env in envs]
        while active := [(copy, r) for copy, r in enumerate(rollouts) if not r.done]:
            samples = policy.act([r.observation for _, r in active], [r.info for _, r in active],
                                 [r.history for _, r in active],
                                 sample_seeds=[sample_seed(seed, task, copy, len(r.actions)) for copy, r in active])
            for (_, rollout), sample in zip(active, samples):
                rollout.step(sample.text)
        played += [(task, rollout) for rollout in rollouts]
    for env in envs:
        env.close()
    return as_groups(played, horizon)


def same_state_pairs(task_ids: np.ndarray, true_keys: np.ndarray, progress: np.ndarray,
                     scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) of steps from the same task and true state whose true progress differs."""
    groups: dict[tuple[int, str], list[int]] = {}
    for i in np.flatnonzero(scored):
        groups.setdefault((int(task_ids[i]), true_keys[i]), []).append(i)
    first, second = [], []
    for members in groups.values():
        members = np.array(members)
        i, j = np.triu_indices(len(members), k=1)
        keep = progress[members[i]] != progress[members[j]]
        first.append(members[i][keep])
        second.append(members[j][keep])
    return (np.concatenate(first), np.concatenate(second)) if first else (np.zeros(0, int), np.zeros(0, int))


def pair_scores(advantages: np.ndarray, progress: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per pair: 1 if the advantages order it as the truth does, 0.5 on a tie, 0 the wrong way."""
    i, j = pairs
    agree = np.sign(advantages[i] - advantages[j]) * np.sign(progress[i] - progress[j])
    return np.where(agree == 0, 0.5, (agree > 0).astype(float))


def pairwise_accuracy(advantages: np.ndarray, progress: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> float:
    return float(np.mean(pair_scores(advantages, progress, pairs))) if len(pairs[0]) else float("nan")


def weighted_agreement(advantages: np.ndarray, progress: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> float:
    i, j = pairs
    gap = advantages[i] - advantages[j]
    return float(np.sum(gap * np.sign(progress[i] - progress[j])) / max(np.sum(np.abs(gap)), 1e-12))


def trap_credit(task_ids: np.ndarray, true_keys: np.ndarray, advantages: np.ndarray, trap_steps: np.ndarray,
                scored: np.ndarray) -> float:
    """Mean (trap step - same-true-state siblings) advantage in units of the advantage std."""
    scale = advantages[scored].std() or 1.0
    diffs = []
    for i in np.flatnonzero(trap_steps & scored):
        siblings = scored & ~trap_steps & (task_ids == task_ids[i]) & (true_keys == true_keys[i])
        if siblings.any():
            diffs.append((advantages[i] - advantages[siblings].mean()) / scale)
    return float(np.mean(diffs)) if diffs else float("nan")


def pair_types(pairs: tuple[np.ndarray, np.ndarray], trap_steps: np.ndarray, step_success: np.ndarray,
               on_successful_path: np.ndarray) -> np.ndarray:
    """Each same-state pair's type, an index into :data:`STATE_TYPES` (first that applies):
    ``trap`` (one of the two steps is a trap step), ``branching point`` (one step is of a
    successful rollout, the other of a failed one: the group's outcomes part there),
    ``successful path`` (a successful rollout visited the state), else ``off path``."""
    i, j = pairs
    return np.select([trap_steps[i] | trap_steps[j], step_success[i] != step_success[j], on_successful_path[i]],
                     [STATE_TYPES.index("trap"), STATE_TYPES.index("branching point"),
                      STATE_TYPES.index("successful path")], STATE_TYPES.index("off path"))


def departures(with_component: np.ndarray, without: np.ndarray, progress: np.ndarray,
               pairs: tuple[np.ndarray, np.ndarray], types: np.ndarray) -> dict[str, dict[str, float]]:
    """Where two credits order same-state pairs differently, per pair type (and ``all``).

    ``changed``: pairs whose order (or tie) differs; ``toward``: of those, the ones
    ``with_component`` orders closer to the truth (its pair score, :func:`pair_scores`, is
    higher), ``away`` the others; ``net``: the sum of the score differences, so ``net / pairs``
    is the pair type's share of the difference in pairwise accuracy."""
    gain = pair_scores(with_component, progress, pairs) - pair_scores(without, progress, pairs)
    out = {}
    for name, members in [("all", np.ones(len(gain), dtype=bool)),
                          *[(kind, types == index) for index, kind in enumerate(STATE_TYPES)]]:
        g = gain[members]
        out[name] = {"pairs": int(members.sum()), "changed": int((g != 0).sum()), "toward": int((g > 0).sum()),
                     "away": int((g < 0).sum()), "net": float(g.sum())}
    return out


def key_statistics(task_ids: np.ndarray, true_keys: np.ndarray, keys: np.ndarray, scored: np.ndarray) -> dict:
    """How a regime's keys (``keys``) group the scored steps' true states: the distinct states
    of each, the share of steps whose key merges two or more true states, and the share whose
    true state is split over two or more keys."""
    true_per_key: dict[tuple[int, str], set[str]] = {}
    keys_per_true: dict[tuple[int, str], set[str]] = {}
    rows = np.flatnonzero(scored)
    for i in rows:
        true_per_key.setdefault((int(task_ids[i]), keys[i]), set()).add(true_keys[i])
        keys_per_true.setdefault((int(task_ids[i]), true_keys[i]), set()).add(keys[i])
    n = max(len(rows), 1)
    return {"states": len(true_per_key), "true_states": len(keys_per_true),
            "merged_steps": sum(len(true_per_key[(int(task_ids[i]), keys[i])]) > 1 for i in rows) / n,
            "split_steps": sum(len(keys_per_true[(int(task_ids[i]), true_keys[i])]) > 1 for i in rows) / n}


def paper_statistics(batch: StepBatch, progress: np.ndarray, preset: dict) -> dict:
    """The paper's shares (see the module doc), and how often MileGPO's tie-breaks point the right way."""
    out = {}
    graph = build_task_graph(batch)
    for label, overrides in (("rcs", {}), ("uniform", {"rcs": False})):
        result = compute_credit("milegpo", batch, {**preset, **overrides})
        d = result.diagnostics
        out["shared_state_share"], out["tie_share"] = d["shared_state_share"], d["tie_share"]
        out[f"ties_broken_{label}"] = d["ties_broken"]
        r_m = result.components["r_M"]
        i, j, _, separated = tied_pairs(batch, graph, r_m)
        truth = separated & (progress[i] != progress[j])
        right = np.sign(r_m[i] - r_m[j]) == np.sign(progress[i] - progress[j])
        out[f"ties_broken_right_{label}"] = float(right[truth].mean()) if truth.any() else float("nan")
        out[f"ties_broken_with_truth_{label}"] = int(truth.sum())
    return out


def variant_config(env_name: str, method: str, overrides: dict) -> dict:
    """A variant's credit config: MileGPO rows get the env's preset (:data:`PRESET`)."""
    preset = {"preset": PRESET[env_name]} if method == "milegpo" and env_name in PRESET else {}
    return {**preset, **overrides}


def score_env(env_name: str, n_tasks: int, group_size: int, seed: int, actor: Actor = random_actor,
              state_keys: tuple[str, ...] = ("env",)) -> dict:
    """One seed's groups, played by ``actor`` (:func:`play_groups`), scored (:func:`score_groups`)."""
    return score_groups(env_name, play_groups(env_name, n_tasks, group_size, seed, actor), seed, state_keys)


def score_groups(env_name: str, groups: Groups, seed: int, state_keys: tuple[str, ...] = ("env",)) -> dict:
    """One seed's groups scored in each regime of ``state_keys``: the credit methods group steps by
    that key, the truth (pairs, d*, traps, pair types) by the true state."""
    truth = groups.batch("env")
    task_ids, true_keys = truth.task_ids, truth.state_keys
    progress = groups.dist - groups.next_dist
    step_success = truth.success[truth.traj_ids]
    solved_tasks = np.unique(task_ids[step_success])
    scored = np.isin(task_ids, solved_tasks)
    trap_steps = ((groups.next_dist > groups.horizon) & (groups.dist <= groups.horizon)) | (progress <= -3)
    pairs = same_state_pairs(task_ids, true_keys, progress, scored)
    types = pair_types(pairs, trap_steps, step_success, groups.on_successful_path())
    row = {"seed": seed, "steps": truth.num_steps, "scored_steps": int(scored.sum()), "pairs": len(pairs[0]),
           "pair_types": {kind: int((types == index).sum()) for index, kind in enumerate(STATE_TYPES)},
           "tasks": len(np.unique(task_ids)), "tasks_with_success": len(solved_tasks),
           "success_rate": float(truth.success.mean()), "trap_steps": int((trap_steps & scored).sum()),
           "regimes": {}}
    for state_key in state_keys:
        batch = groups.batch(state_key)
        advantages = {label: compute_credit(method, batch, variant_config(env_name, method, overrides)).advantages
                      for label, method, overrides in VARIANTS}
        row["regimes"][state_key] = {
            "keys": key_statistics(task_ids, true_keys, batch.state_keys, scored),
            "paper": paper_statistics(batch, progress, variant_config(env_name, "milegpo", {})),
            "methods": {label: {"pairwise_accuracy": pairwise_accuracy(adv, progress, pairs),
                                "weighted_agreement": weighted_agreement(adv, progress, pairs),
                                "trap_credit": trap_credit(task_ids, true_keys, adv, trap_steps, scored)}
                        for label, adv in advantages.items()},
            "breakdown": {component: departures(advantages[with_it], advantages[without], progress, pairs, types)
                          for component, with_it, without in COMPONENTS}}
    return row


METRICS = ("pairwise_accuracy", "weighted_agreement", "trap_credit")


def paired_interval(values: np.ndarray, base: np.ndarray) -> list[float]:
    """95 % t interval of the mean of ``values - base`` over seeds (NaN seeds left out)."""
    diff = (values - base)[np.isfinite(values - base)]
    if len(diff) < 2:
        return [float("nan"), float("nan")]
    half = learning_efficiency.t_quantile(len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    return [float(diff.mean() - half), float(diff.mean() + half)]


def summarize(per_seed: list[dict], state_key: str) -> dict:
    """One regime over seeds: each variant's mean ± std and its paired difference to GraphGPO
    (mean, worst and best seed, 95 % t interval); the paper's statistics, the key statistics
    (means) and the breakdown's counts (summed over seeds)."""
    rows = [r["regimes"][state_key] for r in per_seed]
    summary = {}
    for label, _, _ in VARIANTS:
        if any(label not in r["methods"] for r in rows):  # a variant added since some seeds were scored: summarised
            continue                                       # once every seed is scored again
        entry = {}
        for metric in METRICS:
            values = np.array([r["methods"][label][metric] for r in rows], dtype=float)
            base = np.array([r["methods"]["GraphGPO"][metric] for r in rows], dtype=float)
            entry[metric] = {"mean": float(np.nanmean(values)), "std": float(np.nanstd(values)),
                             "vs_graphgpo_mean": float(np.nanmean(values - base)),
                             "vs_graphgpo_min": float(np.nanmin(values - base)),
                             "vs_graphgpo_max": float(np.nanmax(values - base)),
                             "vs_graphgpo_ci95": paired_interval(values, base)}
        summary[label] = entry
    mean_of = lambda part: {key: float(np.nanmean([r[part][key] for r in rows])) for key in rows[0][part]}  # noqa: E731
    breakdown = {component: {kind: {count: sum(r["breakdown"][component][kind][count] for r in rows)
                                    for count in rows[0]["breakdown"][component][kind]}
                             for kind in rows[0]["breakdown"][component]}
                 for component in rows[0]["breakdown"]}
    paper = {key: {"mean": float(np.nanmean([r["paper"][key] for r in rows])),
                   "std": float(np.nanstd([r["paper"][key] for r in rows]))} for key in rows[0]["paper"]}
    return {"methods": summary, "paper": paper, "keys": mean_of("keys"), "breakdown": breakdown}


def run_label(warm_start: bool, epsilon: float) -> str:
    """The name a run's groups are filed under in a results file."""
    return "warm_start" if warm_start else f"mixture_e{round(epsilon * 100)}" if epsilon < 1.0 else "random"


def as_runs(data: dict) -> dict:
    """A results file as ``{"runs": {label: report}}``; a file of the one-regime layout this script
    wrote before ``--state-key`` (one report, ``summary`` per env) becomes its one run, regime ``env``."""
    if "runs" in data:
        return data
    envs = {name: {**info, "regimes": {"env": info["summary"]}} for name, info in data["envs"].items()}
    return {"runs": {run_label(data.get("warm_start", False), data.get("epsilon", 1.0)): {**data, "envs": envs}}}


def _signed(value: float) -> str:
    return f"{value:+.3f}" if np.isfinite(value) else "–"


def _interval(entry: dict) -> str:
    low, high = entry.get("vs_graphgpo_ci95", [float("nan")] * 2)
    return (f"{entry['vs_graphgpo_mean']:+.3f} [{low:+.3f}, {high:+.3f}]" if np.isfinite(low)
            else _signed(entry["vs_graphgpo_mean"]))


def delta_table(report: dict) -> list[str]:
    """MileGPO − GraphGPO per env and regime, with the seeds' 95 % t interval."""
    lines = [f"### MileGPO − GraphGPO ({report['groups']}; Δ = paired difference, mean [95 % t interval "
             "over seeds])", "",
             "| env | state key | same-state pairs / seed | steps in merged states | GraphGPO accuracy | MileGPO "
             "| Δ accuracy | GraphGPO weighted agreement | MileGPO | Δ weighted agreement |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for env_name, info in report["envs"].items():
        for state_key, summary in info["regimes"].items():
            graph, mile = summary["methods"]["GraphGPO"], summary["methods"]["MileGPO"]
            merged = summary.get("keys", {}).get("merged_steps", 0.0)
            lines.append(
                f"| {env_name} | {state_key} | {info['pairs']:.0f} | {merged:.2f} "
                f"| {graph['pairwise_accuracy']['mean']:.3f} | {mile['pairwise_accuracy']['mean']:.3f} "
                f"| {_interval(mile['pairwise_accuracy'])} "
                f"| {graph['weighted_agreement']['mean']:.3f} | {mile['weighted_agreement']['mean']:.3f} "
                f"| {_interval(mile['weighted_agreement'])} |")
    return lines + [""]


def breakdown_tables(report: dict) -> list[str]:
    """Per env: each component's departures from credit without it, by pair type (see the module doc)."""
    lines = [f"### Where MileGPO's components change the order of same-state pairs ({report['groups']}; "
             "summed over seeds)", "",
             "A cell: the share of the changed pairs that the component orders closer to the truth, the "
             "number changed, and (in brackets) the change of pairwise accuracy they make, over all pairs of all "
             "seeds (pooled, so it weighs seeds by their pairs, unlike the Δ columns' mean over seeds); a row's "
             "changed pairs and changes of accuracy add up to its 'all' cell.", ""]
    for env_name, info in report["envs"].items():
        regimes = {k: v for k, v in info["regimes"].items() if "breakdown" in v}
        if not regimes:
            continue
        totals = {kind: sum(r["pair_types"][kind] for r in info["per_seed"]) for kind in STATE_TYPES}
        lines += [f"**{env_name}** (pairs: " + ", ".join(f"{kind} {n}" for kind, n in totals.items()) + ")", "",
                  "| component | state key | " + " | ".join(STATE_TYPES) + " | all |",
                  "|---|---|" + "---|" * (len(STATE_TYPES) + 1)]
        for component, _, _ in COMPONENTS:
            for state_key, summary in regimes.items():
                counts = summary["breakdown"][component]
                n_all = max(counts["all"]["pairs"], 1)
                cells = [f"{c['toward'] / c['changed']:.2f} of {c['changed']} ({c['net'] / n_all:+.3f})"
                         if c["changed"] else "0 changed" for c in (counts[k] for k in (*STATE_TYPES, "all"))]
                lines.append(f"| {component} | {state_key} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def method_tables(report: dict) -> list[str]:
    groups = report["groups"]
    lines = [f"### Credit against ground truth ({groups}; mean ± std over seeds; "
             "Δ = paired difference to GraphGPO, worst..best seed)", ""]
    for env_name, info in report["envs"].items():
        lines += [f"**{env_name}** ({ground_truth.ENVS[env_name][0]}, {info['tasks']} tasks × {info['group_size']}, "
                  f"seeds {info['seeds']}, rollout success {info['success_rate']:.2f}, "
                  f"{info['pairs']:.0f} same-state pairs per seed)", ""]
        for state_key, summary in info["regimes"].items():
            if len(info["regimes"]) > 1:
                lines += [f"State key `{state_key}`:", ""]
            lines += ["| credit | pairwise accuracy | Δ | weighted agreement | Δ | trap credit (std) |",
                      "|---|---|---|---|---|---|"]
            for label, row in summary["methods"].items():
                acc, wag, trap = row["pairwise_accuracy"], row["weighted_agreement"], row["trap_credit"]
                lines.append(
                    f"| {label} | {acc['mean']:.3f} ± {acc['std']:.3f} "
                    f"| {acc['vs_graphgpo_mean']:+.3f} ({acc['vs_graphgpo_min']:+.3f}..{acc['vs_graphgpo_max']:+.3f}) "
                    f"| {wag['mean']:.3f} ± {wag['std']:.3f} "
                    f"| {wag['vs_graphgpo_mean']:+.3f} ({wag['vs_graphgpo_min']:+.3f}..{wag['vs_graphgpo_max']:+.3f}) "
                    + (f"| {trap['mean']:+.2f} ± {trap['std']:.2f} |" if np.isfinite(trap["mean"]) else "| – |"))
            lines.append("")
    return lines


def paper_table(report: dict) -> list[str]:
    columns = [(env_name, state_key) for env_name, info in report["envs"].items() for state_key in info["regimes"]]
    several = len({state_key for _, state_key in columns}) > 1
    lines = [f"### The paper's statistics side by side (ours: {report['groups']}, tasks with a success)", "",
             "| statistic | " + " | ".join(f"{e} ({k})" if several else e for e, k in columns)
             + " | paper (trained policy) |", "|---|" + "---|" * (len(columns) + 1)]
    names = {"shared_state_share": "transitions leaving a shared state",
             "tie_share": "same-source, distinct-action pairs GraphGPO ties",
             "ties_broken_rcs": "of those, separated by MileGPO (RCS)",
             "ties_broken_uniform": "of those, separated by MileGPO (uniform MD)",
             "ties_broken_right_rcs": "separated the right way, where the truth differs (RCS)",
             "ties_broken_right_uniform": "separated the right way, where the truth differs (uniform)"}
    for key, name in names.items():
        cells = [report["envs"][e]["regimes"][k]["paper"][key] for e, k in columns]
        lines.append(f"| {name} | " + " | ".join(f"{c['mean']:.3f} ± {c['std']:.3f}" for c in cells)
                     + f" | {PAPER.get(key, '–')} |")
    return lines + [""]


def write_tables(data: dict, path: Path) -> None:
    """The Markdown of a results file: per run, the MileGPO − GraphGPO table and the breakdown
    when it has both regimes, each env's full table and the paper's statistics."""
    lines = []
    for report in as_runs(data)["runs"].values():
        if any(len(info["regimes"]) > 1 for info in report["envs"].values()):
            lines += delta_table(report) + breakdown_tables(report)
        lines += method_tables(report) + paper_table(report)
    harness.write_text(path, "\n".join(lines))


def env_entry(per_seed: list[dict], state_keys: list[str]) -> dict:
    """An env's results from its seeds' rows: the per-seed rows, their means and each regime's summary."""
    per_seed = sorted(per_seed, key=lambda r: r["seed"])
    return {"tasks": per_seed[0]["tasks"], "group_size": per_seed[0]["group_size"],
            "seeds": [r["seed"] for r in per_seed],
            "success_rate": float(np.mean([r["success_rate"] for r in per_seed])),
            "pairs": float(np.mean([r["pairs"] for r in per_seed])),
            "wall_s": float(sum(r["wall_s"] for r in per_seed)),
            "regimes": {state_key: summarize(per_seed, state_key) for state_key in state_keys},
            "per_seed": per_seed}


def save_seed(out: Path, label: str, run: dict, env_name: str, row: dict) -> dict:
    """Files one seed's ``row`` under ``env_name`` of run ``label`` in ``OUT.json`` and rewrites
    ``OUT.md``. The file is re-read under a lock, so processes running other groups, envs or seeds
    into the same file at the same time are kept; a stored row of the same seed is replaced, and
    rows of another number of tasks or group size (an earlier setting) are dropped."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = out.with_suffix(".json")
        data = as_runs(json.loads(path.read_text())) if path.exists() else {"runs": {}}
        envs = data["runs"].get(label, {}).get("envs", {})
        rows = [r for r in envs.get(env_name, {}).get("per_seed", [])
                if r["seed"] != row["seed"] and (r["tasks"], r.get("group_size")) == (row["tasks"], row["group_size"])]
        data["runs"][label] = {**run, "envs": {**envs, env_name: env_entry([*rows, row], run["state_keys"])}}
        harness.write_json(path, data)
        write_tables(data, out.with_suffix(".md"))
    return data


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "credit_quality",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--envs", nargs="+", default=list(ground_truth.ENVS), choices=list(ground_truth.ENVS))
    parser.add_argument("--tasks", type=int, default=100, help="tasks per seed (ALFWorld's train split has 48)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="structured groups: the expert's command with probability 1 - epsilon, else a random one "
                             "(1: the random policy)")
    parser.add_argument("--warm-start", action="store_true",
                        help="groups sampled from the policy warm-start learning runs start from (one per seed)")
    parser.add_argument("--state-key", nargs="+", default=["env"], choices=STATE_KEYS,
                        help="the regimes: the key the credit methods group steps by (env: the env's own key; "
                             "observation: the observation text, the paper's); both are scored on the same rollouts")
    parser.add_argument("--policy-cache", default=None,
                        help="with --warm-start: a folder keeping each (env, seed)'s warm-started policy, built once "
                             "and loaded by later runs (default: a temporary folder)")
    parser.add_argument("--tables-only", action="store_true", help="redo OUT.md from OUT.json")
    args = parser.parse_args()
    out = args.out
    if args.tables_only:
        write_tables(json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md"))
        print(out.with_suffix(".md").read_text())
        return

    if args.warm_start and args.epsilon < 1.0:
        parser.error("--warm-start and --epsilon choose the groups' policy: give one of them")
    if args.warm_start:
        groups, policy = ("groups sampled from the warm-started policy",
                          "the policy warm-start learning runs start from (learning_efficiency.py --warm-start)")
    elif args.epsilon < 1.0:
        groups = f"epsilon-mixture groups: expert w.p. {1 - args.epsilon:.1f}, random w.p. {args.epsilon:.1f}"
        policy = f"scripted expert with probability {1 - args.epsilon:g}, else uniform random"
    else:
        groups, policy = "random-policy groups", "uniform random over admissible commands"
    state_keys = tuple(dict.fromkeys(args.state_key))
    run = {"policy": policy, "epsilon": args.epsilon, "warm_start": args.warm_start, "groups": groups,
           "group_size": args.group_size, "state_keys": list(state_keys)}
    label = run_label(args.warm_start, args.epsilon)
    scratch = tempfile.TemporaryDirectory(prefix="credit_quality_")  # the warm starts' tiny LMs, unless cached
    workdir = Path(args.policy_cache or scratch.name)
    for env_name in args.envs:
        for seed in args.seeds:
            started = time.time()
            if args.warm_start:
                groups = play_policy_groups(env_name, args.tasks, args.group_size, seed,
                                            warm_started_policy(env_name, seed, workdir))
            else:
                actor = mixture_actor(args.epsilon) if args.epsilon < 1.0 else random_actor
                groups = play_groups(env_name, args.tasks, args.group_size, seed, actor)
            row = score_groups(env_name, groups, seed, state_keys)
            row.update(group_size=args.group_size, wall_s=time.time() - started)
            save_seed(out, label, run, env_name, row)
            print(f"{label} {env_name} seed {seed}: {row['tasks_with_success']}/{row['tasks']} tasks with a success, "
                  f"{row['pairs']} same-state pairs, {row['wall_s']:.0f} s", flush=True)
    scratch.cleanup()
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
