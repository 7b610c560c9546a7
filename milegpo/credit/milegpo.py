r"""MileGPO = GraphGPO + Milestone Discovery, Reliability-Calibrated Shaping and
Progress-Contrastive Calibration (arXiv 2608.19803).

Notation per task ``q`` (graph of :mod:`milegpo.credit.graph`): :math:`K_q`
trajectories, :math:`p_q^+ = |T_q^+| / K_q`, :math:`p_q^- = 1 - p_q^+`,
:math:`p^+(v) = |T^+(v)| / |T(v)|`, :math:`p^-(v) = 1 - p^+(v)`, likewise :math:`p^+(e)`.
"Max-normalise" divides by the task's maximum (0 stays 0).

**1. Milestone Discovery (MD).** Candidates :math:`S^+`: nodes :math:`v \ne g`
visited by a successful trajectory. **(ours)** The task's start state (visited by
every trajectory, so it carries no contrast) is no candidate, neither milestone nor trap.

.. math::
    S_0^+(v) = w_s\,\ell^+(v) + w_m\,m(v) + w_c\,C(v), \quad
    \ell^+(v) = \max(p^+(v) - p_q^+, 0), \quad
    m(v) = \frac{|T^+(v)|}{\max(|T_q^+|, 1)}, \quad
    C(v) = \frac{\deg(v)}{\max_{v' \in S^+} \deg(v')}

**(ours)** :math:`\deg(v)` counts the distinct edges into and out of :math:`v`,
self-loops excluded. Trap candidates :math:`S^-`: nodes visited only by failed
trajectories and recurring there (by :math:`\ge 2` failed trajectories, or revisited
within one):

.. math::
    S^-(v) = w_f\,\ell^-(v) + w_l\,f^-(v)\,L(v), \quad
    \ell^-(v) = \max(p^-(v) - p_q^-, 0), \quad
    f^-(v) = \frac{|T^-(v)|}{\max(|T_q^-|, 1)}, \quad
    L(v) = \frac{n_\text{revisit}(v)}{\max(|T(v)|, 1)}

Uniform potentials (ablation ``rcs=False``):
:math:`\Phi^\pm(s) = \max_{v \in S^\pm} \omega^{d(s, v)}` (:math:`d(s,v) = \infty` contributes 0).

**2. Reliability-Calibrated Shaping (RCS).**
:math:`\Phi_R^+(s) = \max_{v \in S^+} \bar S_0^+(v)\,\omega^{d(s,v)}`,
:math:`\Phi_R^-(s) = \max_{v \in S^-} \bar S^-(v)\,\omega^{d(s,v)}` (bars: max-normalised),
and the one-sided increments of the transition :math:`s_t \to s_{t+1}`

.. math::
    \delta_t^+ = \max(\gamma_\Phi w_+ \Phi^+(s_{t+1}) - w_+ \Phi^+(s_t), 0), \qquad
    \delta_t^- = \max(\gamma_\Phi w_- \Phi^-(s_{t+1}) - w_- \Phi^-(s_t), 0).

**3. Progress-Contrastive Calibration (PCC).** Branch-counterfactual credit of an
out-edge :math:`e_i = (u, v)`: :math:`\tilde c(e_i) = p^+(e_i) - \mu^+(e_i)`,
:math:`\mu^+` the mean :math:`p^+` of :math:`u`'s other out-edges (self-loops included:
an invalid action is an observed alternative); defined when :math:`u` has
:math:`\ge \kappa_{bc}` other out-edges. **(ours)** A lone edge (allowed when
:math:`\kappa_{bc} = 0`) is compared with the task's base rate, :math:`\mu^+ = p_q^+`.
:math:`\tilde c` is divided by the task's :math:`\max |\tilde c|`, and
:math:`b(v) = \max(0, \max_{e = (u, v)} \tilde c_\text{norm}(e))`.
Local progress of an incoming edge :math:`e = (u, v)` used by a success:

.. math::
    \psi(e) = \alpha_d\,[d(u, g) - d(v, g)] + \alpha_s\,[p^+(v) - p_q^+] - \alpha_f\,\ell^-(e),

:math:`\ell^-(e) = \max(p^-(e) - \mu^-(e), 0)` the edge's excess failure rate over its
siblings (:math:`\mu^-` their mean failure rate; no siblings: :math:`\ell^-(v)`).
:math:`\tilde\psi(v) = \max_e \psi(e)`. **(ours)** "Incoming" excludes self-loops (for
:math:`b` too), and :math:`\bar\psi(v) = \max(\tilde\psi(v), 0) / \max_{v'} \max(\tilde\psi(v'), 0)`
uses the positive part, so the evidence :math:`E(v) = w_{bc}\,b(v) + w_{pg}\,\bar\psi(v) \ge 0`
and the potentials stay in [0, 1]. Keep :math:`z(v) = [\tilde\psi(v) > 0 \lor m(v) \ge \theta_m \lor b(v) > 0]`,

.. math::
    S_\text{pcc}^+(v) = \begin{cases} S_0^+(v)\,(1 + w_\text{pcc} E(v)) & z(v) = 1 \\
    \rho\,S_0^+(v) & z(v) = 0 \end{cases}, \qquad
    \Phi^+(s) = \max_{v \in S^+} \bar S_\text{pcc}^+(v)\,\omega^{d(s,v)}, \quad \Phi^- = \Phi_R^-.

**Step return and advantage.**

.. math::
    r^M_t = c\,\gamma_G^{d(s_{t+1}, g)} + c\lambda(\delta_t^+ - \delta_t^-), \quad
    \hat A^G_t = \text{Norm}_{q,s_t}(r^G_t), \quad \hat A^\text{mix}_t = \text{Norm}_{q,s_t}(r^M_t), \quad
    \hat A^\text{res}_t = \hat A^\text{mix}_t - \hat A^G_t,

.. math::
    A_t = w_\text{step}\,(\hat A^G_t + \eta\,\hat A^\text{res}_t) + w_\text{episode}\,\text{Norm}_q(Z_i).

With :math:`\eta = 0` this is GraphGPO exactly. Since :math:`0 \le \Phi^\pm \le 1`, the raw
correction :math:`c\lambda(\delta^+ - \delta^-)` lies in
:math:`[-c\lambda\gamma_\Phi w_-, c\lambda\gamma_\Phi w_+] = [-0.625, 2.5]` at the defaults.

Ablations (one flag each): ``rcs=False`` (uniform MD; PCC then has nothing to
re-score and is off too), ``pcc=False`` (:math:`\Phi^+ = \Phi_R^+`), ``bcc=False``
(:math:`b \equiv 0`), ``local_progress=False`` (:math:`\bar\psi \equiv 0` and
:math:`\tilde\psi > 0` keeps nothing), ``traps=False`` (:math:`\delta^- \equiv 0`),
``eta=0`` (GraphGPO).

Two opt-ins of ours, off by default: ``shape_failed_tasks=False`` leaves tasks in which no
trajectory succeeded unshaped (their GraphGPO step credit is zero; the paper's trap
potential still shapes them); ``memory_half_life > 0`` is the milestone memory
(:mod:`milegpo.credit.memory`): the counts MD, RCS and PCC read also hold the task's earlier
groups, decayed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from milegpo.credit.base import as_number, check_nonnegative, check_unit, common_diagnostics, step_group_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.diagnostics import describe_state, tie_statistics
from milegpo.credit.graph import build_task_graph
from milegpo.credit.graphgpo import GraphGPOConfig, graph_diagnostics, graph_step_returns
from milegpo.credit.norm import episode_scores, group_normalize
from milegpo.credit.task_graph import TaskGraph

_PRESETS: dict[str, dict[str, Any]] = {
    "alfworld": {"theta_m": 1.1, "rho": 0.0, "eta": 0.20, "kappa_bc": 0},
    "webshop": {"theta_m": 0.5, "rho": 0.5, "eta": 1.0, "kappa_bc": 1},
}


@dataclass(frozen=True)
class MileGPOConfig(GraphGPOConfig):
    """MileGPO hyperparameters; defaults are the paper's (ALFWorld preset).

    Inherits ``c``, ``gamma_g``, ``w_step``, ``w_episode``, ``success_threshold``,
    ``norm`` and ``epsilon`` from :class:`GraphGPOConfig`.

    :param omega: potential decay :math:`\\omega` per graph step (0.20).
    :param gamma_phi: :math:`\\gamma_\\Phi` of the increments (1.0).
    :param lam: shaping weight :math:`\\lambda` (0.25).
    :param w_plus: :math:`w_+`, weight of the milestone potential (1.0).
    :param w_minus: :math:`w_-`, weight of the trap potential (0.25).
    :param w_s: success-rate lift weight (1).
    :param w_m: success-coverage weight (1).
    :param w_c: centrality weight (0.25).
    :param w_f: excess-failure weight of traps (1).
    :param w_l: revisit-intensity weight of traps (0.25).
    :param alpha_d: local progress, distance-drop weight (1).
    :param alpha_s: local progress, success-rate weight (1).
    :param alpha_f: local progress, edge excess-failure weight (1).
    :param w_bc: evidence weight of branch-counterfactual credit (1).
    :param w_pg: evidence weight of local progress (1).
    :param w_pcc: strength of the PCC boost (1).
    :param theta_m: coverage that keeps a candidate without local evidence
        (ALFWorld 1.1 = never, WebShop 0.5).
    :param rho: factor on candidates PCC does not keep (ALFWorld 0, WebShop 0.5).
    :param eta: weight :math:`\\eta` of the residual advantage (ALFWorld 0.20, WebShop 1.0).
    :param kappa_bc: sibling out-edges an edge needs for BCC (ALFWorld 0, WebShop 1).
    :param rcs: Reliability-Calibrated Shaping; ``False`` = uniform MD (and no PCC).
    :param pcc: Progress-Contrastive Calibration.
    :param bcc: branch-counterfactual credit inside PCC.
    :param local_progress: local progress inside PCC.
    :param traps: trap potential :math:`\\delta^-`.
    :param shape_failed_tasks: ``True`` (the paper) shapes every task; ``False`` **(ours, opt-in)**
        leaves tasks without a successful trajectory unshaped, where GraphGPO's step credit is
        exactly zero (every state is equally far from a goal nobody reached) and only the trap
        potential would move the policy.
    :param diagnostics_top_k: milestones / traps per task listed in the diagnostics.
    :param memory_half_life: **(ours, opt-in)** milestone memory (:mod:`milegpo.credit.memory`): the
        visit counts MD, RCS and PCC read are the group's own plus those of the task's earlier groups,
        weighed by :math:`2^{-\text{age} / h}` (age in iterations); ``0`` (the default) is the paper's
        MileGPO, ``inf`` never forgets. Needs the memory carried across iterations
        (:func:`milegpo.credit.memory.remembered_credit`; the trainer does it).
    :param memory_max_states: the most states (and as many edges) the memory keeps per task, the
        most visited first.
    :param memory_max_tasks: the most tasks the memory keeps; the least recently seen are dropped.
    """

    omega: float = 0.20
    gamma_phi: float = 1.0
    lam: float = 0.25
    w_plus: float = 1.0
    w_minus: float = 0.25
    w_s: float = 1.0
    w_m: float = 1.0
    w_c: float = 0.25
    w_f: float = 1.0
    w_l: float = 0.25
    alpha_d: float = 1.0
    alpha_s: float = 1.0
    alpha_f: float = 1.0
    w_bc: float = 1.0
    w_pg: float = 1.0
    w_pcc: float = 1.0
    theta_m: float = 1.1
    rho: float = 0.0
    eta: float = 0.20
    kappa_bc: int = 0
    rcs: bool = True
    pcc: bool = True
    bcc: bool = True
    local_progress: bool = True
    traps: bool = True
    shape_failed_tasks: bool = True
    diagnostics_top_k: int = 3
    memory_half_life: float = 0.0
    memory_max_states: int = 1024
    memory_max_tasks: int = 2000

    def __post_init__(self) -> None:
        super().__post_init__()
        # frozen: the half-life is stored as the float it names (a setting's "inf" is text)
        object.__setattr__(self, "memory_half_life", as_number(
            "memory_half_life", self.memory_half_life, "a number of iterations >= 0 (0: off, inf: never forget)"))
        check_unit(self, ("omega",))
        check_nonnegative(self, ("gamma_phi", "lam", "w_plus", "w_minus", "w_s", "w_m", "w_c", "w_f", "w_l",
                                 "alpha_d", "alpha_s", "alpha_f", "w_bc", "w_pg", "w_pcc", "theta_m", "rho",
                                 "eta", "kappa_bc", "diagnostics_top_k", "memory_half_life"))
        for name in ("memory_max_states", "memory_max_tasks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @classmethod
    def preset(cls, env: str, **overrides: Any) -> MileGPOConfig:
        """The paper's per-env setting (``"alfworld"`` or ``"webshop"``), then ``overrides``."""
        if env not in _PRESETS:
            raise ValueError(f"unknown MileGPO preset {env!r}; presets: {sorted(_PRESETS)}")
        return cls.from_dict({**_PRESETS[env], **overrides})

    def with_ablation(self, **flags: Any) -> MileGPOConfig:
        """A copy with some fields changed, e.g. ``cfg.with_ablation(traps=False)``."""
        return dataclasses.replace(self, **flags)


@dataclass
class MilestoneEvidence:
    """Per-node quantities of Milestone Discovery, RCS and PCC (all (V,) arrays).

    Scores are 0 off their candidate set; ``psi_tilde`` is ``-inf`` where no
    incoming success edge exists.
    """

    milestone: np.ndarray  # bool, v in S^+
    trap: np.ndarray  # bool, v in S^-
    lift: np.ndarray  # l^+(v)
    coverage: np.ndarray  # m(v)
    centrality: np.ndarray  # C(v)
    score0: np.ndarray  # S_0^+
    score_trap: np.ndarray  # S^-
    bcc: np.ndarray  # b(v)
    psi_tilde: np.ndarray  # max local progress of incoming success edges
    psi_bar: np.ndarray
    evidence: np.ndarray  # E(v)
    keep: np.ndarray  # z(v), on milestone candidates
    score_pcc: np.ndarray  # S_pcc^+
    weight_plus: np.ndarray  # the values Phi^+ is built from (S̄_pcc, S̄_0 or 1)
    weight_minus: np.ndarray  # the values Phi^- is built from (S̄^- or 1), 0 without traps
    phi_plus: np.ndarray
    phi_minus: np.ndarray


def _task_normalize(graph: TaskGraph, values: np.ndarray) -> np.ndarray:
    top = graph.task_max(values)[graph.node_task]
    return np.divide(values, top, out=np.zeros_like(values), where=top > 0)


def milestone_evidence(graph: TaskGraph, config: MileGPOConfig) -> MilestoneEvidence:
    """Milestones, traps, their scores and the potentials :math:`\\Phi^\\pm` on ``graph``."""
    cfg = config
    nt = graph.node_task
    p_q = graph.task_p_plus
    p_v = graph.node_p_plus
    n_fail = graph.node_n_traj - graph.node_n_succ
    task_n_fail = graph.task_n_traj - graph.task_n_succ
    eligible = ~graph.is_goal & ~graph.is_start

    # Milestone Discovery.
    milestone = eligible & (graph.node_n_succ > 0)
    lift = np.maximum(p_v - p_q[nt], 0.0)
    coverage = graph.node_n_succ / np.maximum(graph.task_n_succ[nt], 1)
    proper = graph.edge_src != graph.edge_dst
    degree = (np.bincount(graph.edge_src[proper], minlength=graph.num_nodes)
              + np.bincount(graph.edge_dst[proper], minlength=graph.num_nodes)).astype(np.float64)
    centrality = _task_normalize(graph, np.where(milestone, degree, 0.0))
    score0 = np.where(milestone, cfg.w_s * lift + cfg.w_m * coverage + cfg.w_c * centrality, 0.0)

    trap = eligible & (graph.node_n_succ == 0) & (graph.node_n_traj > 0) & ((n_fail >= 2) | (graph.node_n_revisit > 0))
    excess_fail = np.maximum((1.0 - p_v) - (1.0 - p_q[nt]), 0.0)
    fail_cov = n_fail / np.maximum(task_n_fail[nt], 1)
    revisit = graph.node_n_revisit / np.maximum(graph.node_n_traj, 1)
    score_trap = np.where(trap, cfg.w_f * excess_fail + cfg.w_l * fail_cov * revisit, 0.0)

    # Progress-Contrastive Calibration: edge statistics against the sibling out-edges.
    p_e = graph.edge_p_plus
    out_count = np.bincount(graph.edge_src, minlength=graph.num_nodes)[graph.edge_src]
    out_sum = np.bincount(graph.edge_src, weights=p_e, minlength=graph.num_nodes)[graph.edge_src]
    n_sib = out_count - 1
    sib_mean = np.divide(out_sum - p_e, n_sib, out=np.zeros_like(p_e), where=n_sib > 0)
    edge_task = graph.edge_task
    mu_plus = np.where(n_sib > 0, sib_mean, p_q[edge_task])
    bc_defined = n_sib >= cfg.kappa_bc
    c_tilde = np.where(bc_defined, p_e - mu_plus, 0.0)
    c_scale = np.zeros(graph.num_tasks)
    np.maximum.at(c_scale, edge_task, np.abs(c_tilde))
    c_norm = np.divide(c_tilde, c_scale[edge_task], out=np.zeros_like(c_tilde), where=c_scale[edge_task] > 0)
    bcc = np.zeros(graph.num_nodes)
    if cfg.bcc:
        np.maximum.at(bcc, graph.edge_dst[proper], np.maximum(c_norm[proper], 0.0))

    d = graph.dist_to_goal
    edge_excess_fail = np.where(n_sib > 0, np.maximum(sib_mean - p_e, 0.0), excess_fail[graph.edge_dst])
    psi = (cfg.alpha_d * (d[graph.edge_src] - d[graph.edge_dst])
           + cfg.alpha_s * (p_v[graph.edge_dst] - p_q[edge_task])
           - cfg.alpha_f * edge_excess_fail)
    psi_tilde = np.full(graph.num_nodes, -np.inf)
    success_edge = proper & (graph.edge_n_succ > 0)
    np.maximum.at(psi_tilde, graph.edge_dst[success_edge], psi[success_edge])
    psi_pos = np.where(milestone, np.maximum(psi_tilde, 0.0), 0.0)
    psi_bar = _task_normalize(graph, psi_pos) if cfg.local_progress else np.zeros(graph.num_nodes)
    evidence = cfg.w_bc * bcc + cfg.w_pg * psi_bar
    keep = milestone & ((coverage >= cfg.theta_m) | (bcc > 0) | ((psi_tilde > 0) & cfg.local_progress))
    score_pcc = np.where(keep, score0 * (1.0 + cfg.w_pcc * evidence), cfg.rho * score0)

    # Reliability-Calibrated Shaping: the potentials.
    if not cfg.rcs:
        weight_plus, weight_minus = milestone.astype(np.float64), trap.astype(np.float64)
    else:
        weight_plus = _task_normalize(graph, score_pcc if cfg.pcc else score0)
        weight_minus = _task_normalize(graph, score_trap)
    if not cfg.traps:
        weight_minus = np.zeros(graph.num_nodes)
    return MilestoneEvidence(
        milestone=milestone, trap=trap, lift=lift, coverage=coverage, centrality=centrality, score0=score0,
        score_trap=score_trap, bcc=bcc, psi_tilde=psi_tilde, psi_bar=psi_bar, evidence=evidence, keep=keep,
        score_pcc=score_pcc, weight_plus=weight_plus, weight_minus=weight_minus,
        phi_plus=graph.max_potential(weight_plus, cfg.omega), phi_minus=graph.max_potential(weight_minus, cfg.omega),
    )


def milegpo(batch: StepBatch, config: MileGPOConfig | None = None, graph: TaskGraph | None = None,
            evidence: TaskGraph | None = None) -> CreditResult:
    """MileGPO credit for every step row of ``batch``.

    :param graph: ``batch``'s task graph, when the caller has built it.
    :param evidence: the graph whose visit counts MD, RCS and PCC read (default ``graph``): ``graph``
        with the counts of the milestone memory added (:func:`milegpo.credit.memory.remembered_credit`).
        The GraphGPO term, the normalisation and the episode term always read ``graph``.
    """
    cfg = config or MileGPOConfig()
    if cfg.memory_half_life > 0 and evidence is None:
        raise ValueError(f"memory_half_life={cfg.memory_half_life}: MileGPO with the milestone memory needs the "
                         "memory of earlier iterations, which compute_credit does not carry (nor can a report "
                         "recompute it from a kept batch): credit through milegpo.credit.memory.remembered_credit "
                         "(the trainer does), or set memory_half_life=0")
    graph = graph or build_task_graph(batch, batch.success_mask(cfg.success_threshold))
    counted = graph if evidence is None else evidence
    ev = milestone_evidence(counted, cfg)
    src, dst = graph.row_src, graph.row_dst
    delta_plus = np.maximum(cfg.gamma_phi * cfg.w_plus * ev.phi_plus[dst] - cfg.w_plus * ev.phi_plus[src], 0.0)
    delta_minus = np.maximum(cfg.gamma_phi * cfg.w_minus * ev.phi_minus[dst] - cfg.w_minus * ev.phi_minus[src], 0.0)
    shaping = cfg.c * cfg.lam * (delta_plus - delta_minus)
    if not cfg.shape_failed_tasks:
        shaping = np.where(graph.task_n_succ[graph.row_task] > 0, shaping, 0.0)
    r_g = graph_step_returns(batch, graph, cfg)
    r_m = r_g + shaping
    a_g = group_normalize(r_g, src, graph.num_nodes, cfg.norm, cfg.epsilon)
    a_mix = group_normalize(r_m, src, graph.num_nodes, cfg.norm, cfg.epsilon)
    a_res = a_mix - a_g
    episode = episode_scores(batch, graph, cfg.norm, cfg.epsilon, cfg.upstream_exact)
    adv = cfg.w_step * (a_g + cfg.eta * a_res) + cfg.w_episode * episode

    diagnostics = {
        "method": "milegpo",
        **common_diagnostics(graph, adv, episode),
        **step_group_diagnostics(graph),
        **graph_diagnostics(graph),
        **tie_statistics(batch, graph, r_m),
        **_milestone_diagnostics(counted, ev, cfg.diagnostics_top_k),
        "shaping_min": float(shaping.min(initial=0.0)),
        "shaping_max": float(shaping.max(initial=0.0)),
        "frac_steps_shaped": float(np.mean(shaping != 0)) if len(shaping) else 0.0,
    }
    components = {"r_G": r_g, "r_M": r_m, "shaping": shaping, "delta_plus": delta_plus, "delta_minus": delta_minus,
                  "phi_plus": ev.phi_plus[src], "phi_minus": ev.phi_minus[src], "A_G": a_g, "A_mix": a_mix,
                  "A_res": a_res, "episode": episode, "d_next": graph.dist_to_goal[dst]}
    return CreditResult(advantages=adv, diagnostics=diagnostics, components=components)


def _milestone_diagnostics(graph: TaskGraph, ev: MilestoneEvidence, top_k: int) -> dict[str, Any]:
    """Counts over the batch, and per task the ``top_k`` milestones and traps with their evidence."""
    n_cand = int(ev.milestone.sum())
    out: dict[str, Any] = {
        "num_milestone_candidates": n_cand,
        "num_milestones_kept": int(ev.keep.sum()),
        "pcc_keep_frac": float(ev.keep.sum() / n_cand) if n_cand else 0.0,
        "num_trap_candidates": int(ev.trap.sum()),
        "milestones": [],
        "traps": [],
    }
    if top_k == 0:
        return out
    n_fail = graph.node_n_traj - graph.node_n_succ
    # counts are whole numbers, or fractional where the milestone memory's decayed counts are added
    count = int if np.issubdtype(graph.node_n_traj.dtype, np.integer) else float
    # (name, values, type): the fields of each listed node, read column by column (one list per field,
    # not one numpy scalar per node and field: ~6,600 nodes for 1,100 tasks)
    milestone_fields = (("score", ev.score0, float), ("score_pcc", ev.score_pcc, float),
                        ("weight", ev.weight_plus, float), ("kept", ev.keep, bool), ("lift", ev.lift, float),
                        ("coverage", ev.coverage, float), ("centrality", ev.centrality, float),
                        ("bcc", ev.bcc, float), ("progress", ev.psi_tilde, float),
                        ("n_success", graph.node_n_succ, count), ("n_visits", graph.node_n_traj, count),
                        ("d_goal", graph.dist_to_goal, float))
    trap_fields = (("score", ev.score_trap, float), ("weight", ev.weight_minus, float), ("n_fail", n_fail, count),
                   ("n_revisit", graph.node_n_revisit, count))
    listings = ((np.flatnonzero(ev.milestone), ev.weight_plus, out["milestones"], milestone_fields),
                (np.flatnonzero(ev.trap), ev.score_trap, out["traps"], trap_fields))
    for nodes, key, sink, fields in listings:
        # Best first within each task: sort by (task, -score), then take the first top_k of each task.
        order = nodes[np.lexsort((-key[nodes], graph.node_task[nodes]))]
        tasks = graph.node_task[order]
        rank = np.arange(len(order)) - np.searchsorted(tasks, tasks)
        listed = order[rank < top_k]
        columns = {"task": graph.task_values[graph.node_task[listed]].astype(int).tolist(),
                   "state": [describe_state(k) for k in graph.keys_of(listed).tolist()]}
        for name, values, kind in fields:
            columns[name] = values[listed].astype(kind).tolist()
        if "progress" in columns:  # no incoming success edge (-inf): no progress
            columns["progress"] = [x if math.isfinite(x) else None for x in columns["progress"]]
        sink.extend(dict(zip(columns, row)) for row in zip(*columns.values()))
    return out
