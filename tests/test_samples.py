"""Every sample, ours, the real-world cases and those run by libraries, through `python -m explainer run --json`: the right
kind, culprit and line, and `fixes[0]` applied to the script makes it run clean and train what
its twin trains. Fixed twins and clean scripts give nothing."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import ahead
import boundary_labels
import pytest
import torch

import manifest
import trained
from _device import DEVICE
from explainer.fixes.edits import apply_edits
from explainer.model import Finding, Fix
from explainer.runtime.records import is_library_file

EVERY = manifest.samples() + manifest.real_cases() + manifest.library_cases()
BUGGY = [s for s in EVERY if s.kind != "none"]
CLEAN = [s for s in EVERY if s.kind == "none"]
TWINS = [s for s in EVERY if s.fixed is not None]
# Real-world cases the engine does not yet get right, each with what goes wrong today. Strict:
# a case that starts passing fails here until it leaves this list.
NOT_YET: dict[str, str] = {
    "real/anomaly_prediction_d_step_before_g_backward": "every fix offered steps each optimizer with its own loss's "
                                                        "gradients; the twin steps both after both backwards, "
                                                        "so the generator's loss also reaches the discriminator's",
    "real/deep_object_reid_center_loss_step_before_total_backward": "the centers are named, but where the "
                                                                     "metric loss kept its graph (83), not at "
                                                                     "its call (192), and no fix: the twin moves "
                                                                     "`center_optimizer.step()` after the caller's "
                                                                     "`total_loss.backward()`, across methods",
    "real/mmcv_cumulative_hook_with_optimizer_hook": "named `self.outputs` (145), the runner's alias, not `outputs` "
                                                     "(144) where train_step made it; no fix: the twin registers one "
                                                     "optimizer hook instead of two, in the config",
    "real/quaterion_xbm_buffer_view_overwritten": "`self._embeddings` (39) is named and fixes[0] copies both "
                                                  "returns of `get()`, as the twin does, but the next step then "
                                                  "fails in the old Euclidean distance, which the twin also "
                                                  "replaces with `torch.cdist` (a second bug, of shapes)",
    "real/pearl_ddpg_lstm_critic_then_actor_backward": "`batch.state` at line 139 is named, but no fix: the "
                                                       "twin sums the critic's and the actor's losses for one "
                                                       "backward, then steps both",
    "real/rlsolver_l2o_surrogate_theta_list_graph": "`self.theta_list` (179) is named, but no fix; the twin "
                                                    "also fixes a second bug the first hides (the surrogate's "
                                                    "step changes weights `all_losses.backward()` needs: the "
                                                    "objective is evaluated with a deep copy)",
    "real/adaptive_navigation_cached_gat_state_after_step": "named `self.utils.gat.gat_net[1].scoring_fn_target`, "
                                                            "the stepping agent's path to the weight, not `self.gat` "
                                                            "as Utils wrote it where the graph was built (68), and "
                                                            "no fix: the twin stops caching the GAT's output and "
                                                            "runs it for each loss",
    "real/argmax_coor_loss": "`torch.argmax` at line 37 is named, but no fix: a loss on argmax needs "
                             "another loss (cross-entropy on the bin scores), not an undone cut",
    "real/bicyclegan_z_l1_after_e_step": "netE's step is named, but no fix: the twin back-propagates both losses "
                                         "before either step, netE frozen for the second (G then steps once on "
                                         "their sum)",
    "real/keras_stateful_lstm_state_assign": "named `self._value` (line 19), where Variable.value hands the graph "
                                             "the tensor assign() overwrites, not the layer's `self.states`; "
                                             "fixes[0] trains what the twin trains",
    "real/maddpg_soft_update_target_actor": "the soft update (load_state_dict) is named, but no fix: the "
                                            "twin changes the algorithm (target actions under no_grad, each "
                                            "agent's actor re-run with the others' actions from the buffer)",
    "real/nf_soft_mining_prop_viewdirs": "named `rgb`, shared by the two backward calls, not `t_dirs` in the "
                                         "proposal networks' closure, where the estimator's graph enters the rays'",
    "real/pchrist_sac_discrete_actor_loss_before_critic_steps": "named where the critic ran inside "
                                                                "`calculate_actor_loss` (131), but no fix: the "
                                                                "critics' steps and the actor's run in one call "
                                                                "(`update_all_parameters`), which the maintainers "
                                                                "split to compute the actor's loss between them",
    "real/drit_update_eg_stale_forward": "fixes[0] runs `self.forward()` again before `backward_G_alone()`, as the "
                                         "commenter did, and trains what the twin trains, but is offered as unsafe: "
                                         "run again, the forward draws new random codes (`get_z_random`)",
    "real/pyg_graph_autoencoder_loss_on_inputs": "named right (63), but fixes[0] (unsafe) compares the unread `out` "
                                                 "with `data.x`; the maintainer compares it with `data.y`, which "
                                                 "the code does not say",
    "real/cleanrl_ppo_continuous_values_buffer_keeps_rollout_graph": "named right (121), but no fix: the twin runs the "
                                                                     "rollout under no_grad and the value net again "
                                                                     "in every update epoch on the whole rollout "
                                                                     "(`vf.forward(obs[:step+1])`), which the per-step "
                                                                     "write does not say",
    "real/tntorch_optimize_losses_keep_graph": "no finding: each iteration's loss stays in `losses` (58) with "
                                               "the graph `backward(retain_graph=True)` kept, and no growth is "
                                               "looked for where the call retains its graph; the twin also "
                                               "steps before the stopping test, one step more than a detach",
    "real/flmrcm_adv_g_loss_item_cut": "nothing to explain at runtime: `loss_adv_g.detach().item()` (139) makes the "
                                       "adversarial term a float, the loss still has the L1 term's graph, and "
                                       "nothing raises",
    "real/torchts_dcgru_fc_gate_inplace": "named and written out of place, but the twin also drops a second "
                                          "sigmoid that forward applies again, so it trains other weights",
    "real/gdrl_sac_policy_loss_after_value_steps": "named right (104), and fixes[0] updates the policy before the "
                                                   "value models, after the Q targets are computed with the policy "
                                                   "as it was; the forum's fix updates it before the Q targets, so "
                                                   "they are computed with the updated policy",
    "real/mvanet_mclm_relu_inplace_dropout": "named right (140), and fixes[0] copies the ReLU's output before the "
                                             "dropout that `m.inplace = True` made in place, as the maintainer "
                                             "did, but the next step fails on a second bug the twin also fixes "
                                             "(`self.p_poses = []` at the top of forward)",
}
# Causes whose carrier holds history of an earlier step: carried state, running totals, a
# discarded detach, stored history, a graph retained across iterations.
HISTORY_OF_EARLIER_STEPS = {"BX001", "BX002", "BX003", "BX005", "BX008"}


def test_there_are_enough_samples():
    assert len([s for s in BUGGY if s in manifest.samples()]) >= 20 and len(TWINS) == len(BUGGY)
    assert len(manifest.real_cases()) >= 30
    assert set(NOT_YET) <= {s.name for s in BUGGY} and set(SECOND_BUG) <= set(NOT_YET)


def test_the_readme_counts_the_real_cases_fixed_right_as_not_yet_leaves_them():
    """README's figure: of the real-world cases, those whose fixes[0] is right end to end, and
    the rest, listed in NOT_YET."""
    real = [s for s in manifest.real_cases() if s.kind != "none"]
    waiting = [s for s in real if s.name in NOT_YET]
    words = {"twenty": 20, "twenty-one": 21, "twenty-two": 22, "nineteen": 19, "eighteen": 18, "seventeen": 17, "sixteen": 16, "fifteen": 15}
    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    said = f"{len(real) - len(waiting)} of the {len(real)} real-world cases do, and the other "
    assert said in readme
    rest = readme[readme.index(said) + len(said):].split(" ", 1)[0]
    assert (int(rest) if rest.isdigit() else words[rest]) == len(waiting)


def _marked(samples: list) -> list:
    return [pytest.param(s, marks=pytest.mark.xfail(reason=NOT_YET[s.name], strict=True))
            if s.name in NOT_YET else s for s in samples]


def _patched(sample: manifest.Sample, fix: dict, folder: Path) -> Path:
    """A copy of the sample with `fix` applied, beside the `_device.py` that needs no parent."""
    patched = folder / sample.path.name
    patched.parent.mkdir(parents=True)
    shutil.copy(manifest.HERE / "_device.py", patched.parent)
    patched.write_text(apply_edits(sample.path.read_text(), Fix.from_json(fix).edits))
    return patched


# What each test reads from runs started ahead (tests/ahead.py).
READS = {
    "test_buggy_sample_is_explained_and_fixes_0_trains_what_its_twin_trains":
        lambda s: (ahead.explaining(s.path, ahead.AHEAD), ahead.training(s.twins[0], ahead.AHEAD)),
    "test_no_safe_fix_crashes": lambda s: ahead.explaining(s.path, ahead.AHEAD),
    "test_fixed_twin_runs_clean": lambda s: ahead.explaining(s.fixed, ahead.AHEAD),
    "test_clean_seed_scenario_gives_no_finding": lambda s: ahead.explaining(s.path, ahead.AHEAD),
}


@pytest.fixture(scope="module", autouse=True)
def _runs_ahead(request):
    ahead.plan(request.session.items, sys.modules[__name__], READS)


@pytest.mark.parametrize("sample", _marked(BUGGY), ids=lambda s: s.name)
def test_buggy_sample_is_explained_and_fixes_0_trains_what_its_twin_trains(sample, tmp_path):
    run = ahead.explaining(sample.path).result()
    if sample.kind == "graph-growth":
        assert run.returncode == 0, run.stderr
    else:
        assert run.returncode == 1
    assert len(run.findings) == 1, run.stderr
    finding = run.findings[0]
    assert finding["kind"] == sample.kind
    culprit = finding["culprits"][0]
    assert culprit["name"] == sample.culprit_on(DEVICE.type)
    assert culprit["location"]["row"] == sample.culprit_row
    assert culprit["filename"] == str(sample.path)
    # Every line it cites is the user's: none of a library's (accelerate's or Lightning's own
    # backward call, loops and optimizer wrappers).
    cited = [finding["backward"], finding["freed_by"], *finding["steps"], *finding["culprits"]]
    assert not [c for c in cited if c and is_library_file(c["filename"])], cited
    assert "[explainer]" in run.stderr
    if sample.name == "libraries/lightning_rnn_state":  # the user's line runs the backward, inside Lightning
        assert "The backward run inside `trainer.fit(model, loader)` in the previous iteration freed" in \
            " ".join(finding["message"].split())
    # The JSON is the Finding, whole: an editor reading it back gets the same facts and sentences.
    assert Finding.from_json(finding).to_json() == finding
    # Its boundary picture, in text and SVG, shows the finding's own carrier, lines and calls.
    assert boundary_labels.missing(finding) == []

    fix = finding["fixes"][0]
    assert {e["filename"] for e in fix["edits"]} == {str(sample.path)}
    patched = _patched(sample, fix, tmp_path / "patched")
    after = ahead.now(ahead.explained, patched, tmp_path)
    fixed = ahead.now(ahead.trained_of, patched, tmp_path / "fixed.pt").result()
    assert (after.result().returncode, after.result().findings) == (0, []), after.result().stderr
    assert ahead.like_a_twin(fixed, sample.twins) == []
    if fix["applicability"] == "safe" and finding["code"] not in HISTORY_OF_EARLIER_STEPS:
        return
    buggy = ahead.training(sample.path).result()
    twin_keeps_first_step = not trained.changes_first_step(buggy, ahead.training(sample.fixed).result())
    # A safe fix leaves this step's gradients alone. When the expert's own fix changes them (a
    # cache read again within the step that fills it, detached as upstream did; a moving
    # average updated from detached features), the right fix cannot be safe: it must say so.
    assert fix["applicability"] == "safe" or not twin_keeps_first_step
    if finding["code"] in HISTORY_OF_EARLIER_STEPS and twin_keeps_first_step:
        # The bug only bites from the second step on: a right fix leaves the first one alone.
        assert buggy["first_backward"] is not None
        assert trained.same_first_step(buggy, fixed) == []


# Samples with a second bug of their own, which the expert's twin fixes too and which the script
# reaches only once the autograd error is fixed: a safe fix ends with that error, no other.
SECOND_BUG = {
    # Quaterion's old Euclidean distance takes the diagonal of a non-square product once the
    # memory holds more rows than the batch; the maintainers' commit replaced it with torch.cdist.
    "real/quaterion_xbm_buffer_view_overwritten": "RuntimeError: The size of tensor a (4) must match the size of "
                                                  "tensor b (8) at non-singleton dimension 1",
    # MVANet's MCLM empties its cached positional embeddings at the top of every forward, and
    # builds them only while `self.g_pos` is None: the second forward adds an empty list.
    "real/mvanet_mclm_relu_inplace_dropout": "TypeError: unsupported operand type(s) for +: 'Tensor' and 'list'",
}


@pytest.mark.parametrize("sample", BUGGY, ids=lambda s: s.name)
def test_no_safe_fix_crashes(sample, tmp_path):
    """Every fix offered as safe, applied on its own, lets the script run to its end, on every
    sample, the ones the engine does not yet get right included. (`fixes[0]` of the others is
    run above.)"""
    findings = ahead.explaining(sample.path).result().findings
    fixes = [f for f in findings[0]["fixes"] if f["applicability"] == "safe"] if findings else []
    checked = fixes if sample.name in NOT_YET else fixes[1:]
    runs = [ahead.now(ahead.trained_of, _patched(sample, fix, tmp_path / str(i)), tmp_path / f"{i}.pt")
            for i, fix in enumerate(checked)]
    for fix, run in zip(checked, runs):
        assert run.result()["error"] == SECOND_BUG.get(sample.name), fix["message"]


@pytest.mark.parametrize("sample", TWINS, ids=lambda s: s.name)
def test_fixed_twin_runs_clean(sample):
    run = ahead.explaining(sample.fixed).result()
    assert (run.returncode, run.findings) == (0, []), run.stderr


@pytest.mark.parametrize("sample", CLEAN, ids=lambda s: s.name)
def test_clean_seed_scenario_gives_no_finding(sample):
    run = ahead.explaining(sample.path).result()
    assert (run.returncode, run.findings) == (0, []), run.stderr


TWO_LOSSES_ONE_STEPPED_FIRST = """
import torch
torch.manual_seed(0)
manager, worker = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
opt_m, opt_w = torch.optim.SGD(manager.parameters(), lr=0.1), torch.optim.SGD(worker.parameters(), lr=0.1)
for _ in range(2):
    goal = manager(torch.randn(4, 3))
    for opt, loss in ((opt_m, goal.pow(2).mean()), (opt_w, worker(goal).mean())):
        opt.zero_grad()
        loss.backward(retain_graph=True)
        STEP_HERE
    STEP_AFTER
"""


def test_the_first_step_is_read_when_the_first_optimizer_step_begins(tmp_path):
    """Stepping each optimizer after all the losses' backward calls leaves the first backward's
    gradients alone, yet the manager's first step then also applies the worker's loss: that is
    what it trains, so what each optimizer's first step applies is compared too."""
    def result(name: str, step_here: str, step_after: str) -> dict:
        script = tmp_path / f"{name}.py"
        script.write_text(TWO_LOSSES_ONE_STEPPED_FIRST.replace("STEP_HERE", step_here).replace("STEP_AFTER", step_after))
        return trained.trained_by(script, tmp_path / f"{name}.pt")

    each = result("each", "opt.step()", "pass")
    after = result("after", "pass", "opt_m.step(); opt_w.step()")
    assert each["error"] is None and after["error"] is None
    assert trained.same_first_step(each, after) != []
    assert trained.changes_first_step(each, after)
    # The gradients when the first backward returned are the same in both, and compared.
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(each["first_backward"], after["first_backward"])
               if x is not None and y is not None)
    assert [x is None for _, x in each["first_backward"]] == [x is None for _, x in after["first_backward"]]
    # Only what each optimizer applies counts: the worker's first step is the same in both.
    assert trained.same_first_step(each, after) == ["SGD#0.group0[0] in its optimizer's first step: the gradient differs",
                                                    "SGD#0.group0[1] in its optimizer's first step: the gradient differs"]
    assert not [d for d in trained.same_first_step(each, after) if "after the first backward" in d]
    # A script that updates its weights by hand is read where its first backward returned.
    by_hand = result("by_hand", "pass", "pass")
    assert by_hand["first_step"] == {} and by_hand["first_backward"] is not None
    assert trained.same_first_step(by_hand, each) == trained.same_first_step(by_hand, after) == []
