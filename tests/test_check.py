"""`python -m explainer check`: the rules on the samples (flagged at the culprit line, twins and
clean scripts silent), the fixes of some rules' INVALID cases, suppressions and the CLI contract.
Each rule's own VALID and INVALID cases run in tests/test_causes.py."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import ahead
import pytest

import manifest
from conftest import ROOT
from explainer.causes import CAUSES
from explainer.fixes.edits import apply_edits
from explainer.model import Edit, Fix, Location
from explainer.static.check import check_paths, check_text
from explainer.static.rules import RULES

# The code expected at each buggy sample's culprit line.
EXPECTED = {
    "rnn_hidden_chunks": "BX001", "lstm_tuple_state": "BX001", "discarded_detach": "BX001",
    "module_rnn_state": "BX001", "ema_attribute": "BX001", "seed003_stored_states": "BX001",
    "seed003_yest_carried": "BX001", "seed003_yest_retain_graph": "BX001", "running_loss_total": "BX002",
    "helper_returns_state": "BX001", "state_kept_after_backward": "BX001",
    "weight_outside_loop": "BX004", "lbfgs_closure": "BX004", "init_derived_tensor": "BX004",
    "past_states_list": "BX005", "dict_cache": "BX005", "reinforce_log_probs": "BX005",
    "gan_fake_reuse": "BX006", "multitask_two_losses": "BX006", "seed000_ex1_two_losses": "BX006",
    "actor_critic_step": "BX007", "gan_step_before_g": "BX007", "seed000_ex2_retain_graph": "BX007",
    "seed002_ex1_hidden_layer": "BX007",
    "no_grad_forward": "BX009", "seed000_ex3_detach": "BX009",
    "grad_then_backward": "BX010", "maml_fast_weights": "BX001",
}
SAMPLES = {s.name: s for s in manifest.samples()}
# Buggy samples the checker does not find yet, with why; the runtime explains them. When it
# learns one, test_known_static_misses_are_still_missed fails: move it to EXPECTED.
STATIC_MISSES = {
    # BX001 judges `self.` state in `forward` only; this one lives in a plain object's method.
    "attribute_replaced_after_read",
}
# Runs clean, but steps and then back-propagates through the pre-step graph again: the second
# gradient is stale (samples/README.md). The checker is right to flag it.
SILENTLY_WRONG = {"seed002_ex1_retain_then_step": ("BX007", "output = model(x)")}


def test_every_buggy_sample_has_an_expected_code():
    assert set(EXPECTED) | set(STATIC_MISSES) == {s.name for s in SAMPLES.values() if s.kind != "none"}
    assert not set(EXPECTED) & set(STATIC_MISSES)


@pytest.mark.parametrize("name", sorted(STATIC_MISSES))
def test_known_static_misses_are_still_missed(name):
    sample = SAMPLES[name]
    assert [d.code for d in check_file(sample.path) if d.location.row == sample.culprit_row] == []


def check_file(path):
    return check_text(path.read_text(), str(path))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_buggy_sample_is_flagged_at_its_culprit_line_and_its_fix_silences_it(name):
    sample = SAMPLES[name]
    found = [d for d in check_file(sample.path) if d.location.row == sample.culprit_row]
    assert [d.code for d in found] == [EXPECTED[name]]
    fix = found[0].fix
    assert fix is not None
    patched = apply_edits(sample.path.read_text(), fix.edits)
    compile(patched, name, "exec")
    assert not [d for d in check_text(patched, str(sample.path)) if d.code == EXPECTED[name]]


def _at_culprit(sample) -> list:
    return [d for d in check_file(sample.path) if d.location.row == sample.culprit_row]


def _safe_fix_at_culprit(sample) -> bool:
    found = _at_culprit(sample)
    return bool(found) and found[0].fix is not None and found[0].fix.applicability == "safe"


def test_the_checker_flags_49_real_cases_at_their_culprit_line():
    """README's figure: of the 182 real-world cases, those flagged at the culprit line from source."""
    real = [s for s in manifest.real_cases() if s.kind != "none"]
    assert len(real) == 182
    assert len([s for s in real if _at_culprit(s)]) >= 49


# Every buggy sample, ours, the real-world cases and those run by libraries, that the checker
# flags at its culprit line with a safe fix.
SAFELY_FIXED = [s for s in manifest.samples() + manifest.real_cases() + manifest.library_cases()
                if s.kind != "none" and _safe_fix_at_culprit(s)]


def test_the_checker_offers_a_safe_fix_on_most_of_our_samples_and_on_real_cases():
    assert len([s for s in SAFELY_FIXED if s in manifest.samples()]) >= 25
    assert [s.name for s in SAFELY_FIXED if s in manifest.real_cases()] == [
        "real/again_melgan_d_fake_before_d_step", "real/amphion_valle_epoch_sum_loss_graph",
        "real/brax_ppo_total_loss_graph", "real/cdc_resnet_block_time_emb_inplace",
        "real/csnet_res_encoder_inplace_residual",
        "real/denoising_diffusion_conv1d_input_outside_loop",
        "real/face_alignment_get_landmarks_disables_grad_globally", "real/h3dnet_refine_inplace_residual",
        "real/imvisible_running_loss_keeps_graph", "real/infini_attention_memory",
        "real/infomaxvae_info_loss_after_vae_step",
        "real/labelmodels_running_loss_graph", "real/medipixel_ppo_total_loss_twice",
        "real/microbial_hrnet_basic_block_inplace_residual",
        "real/ml2021_hw7_train_loss_graph", "real/morvanzhou_gan_d_step_before_g_backward",
        "real/morvanzhou_rnn_regressor_h_state_not_repacked", "real/neural_clbf_descent_violation_relu_inplace_mul",
        "real/nnr_gcn_layer_residual_inplace_add", "real/openasr_iter_one_epoch_tot_loss_graph",
        "real/pyod_deepsvdd_weight_penalty_built_once", "real/pytorch_gan_wgan_fake_imgs",
        "real/ray_finetune_llm_loss_sum_graph", "real/resample_retain_step", "real/sam_second_pass_reuses_output",
        "real/sam_tasks_loss_not_reset",
        "real/silero_vad_init_jit_model_disables_grad_globally",
        "real/so_gan_loss_d_through_generator", "real/srgan_d_step_before_g_loss",
        "real/tbd_check_accuracy_grad_off", "real/text_summarizer_epoch_loss_train_graph",
        "real/vq_pytorch_ema_lerp_keeps_encoder_graph"]


@pytest.fixture(scope="module", autouse=True)
def _twins_trained_ahead(request):
    ahead.plan(request.session.items, sys.modules[__name__], {
        "test_check_fix_makes_the_script_train_what_its_twin_trains": lambda s: ahead.training(s.twins[0], ahead.AHEAD)})


@pytest.mark.parametrize("sample", SAFELY_FIXED, ids=lambda s: s.name)
def test_check_fix_makes_the_script_train_what_its_twin_trains(sample, tmp_path):
    """`explainer check --fix` on a copy of the sample: the safe fixes leave a script that runs
    clean and trains the weights its expert-fixed twin trains, with the same seed."""
    patched = tmp_path / sample.path.name
    shutil.copy(sample.path, patched)
    shutil.copy(manifest.HERE / "_device.py", tmp_path)
    assert check_paths([str(patched)], fix=True).fixed >= 1
    result = ahead.trained_of(patched, tmp_path / "fixed.pt")
    assert result["error"] is None
    assert ahead.like_a_twin(result, sample.twins) == []


@pytest.mark.parametrize("name, why", [
    # The second critic recomputed after the first one's step, but the actor's loss still reads
    # both critics' Q values from before their steps: the fixed script would fail there.
    ("real/tianshou_sac_batched_critic", "leaves another"),
    # The recomputed value reads the imagined rollout, made before the step: which weights the
    # second loss means to use, the source does not say.
    ("real/dreamer_value_step_before_action", "reads history"),
])
def test_a_recompute_the_source_cannot_prove_is_unsafe(name, why):
    sample = {s.name: s for s in manifest.real_cases()}[name]
    [found] = [d for d in check_file(sample.path) if d.location.row == sample.culprit_row]
    assert (found.code, found.fix.applicability) == ("BX007", "unsafe")
    if why == "leaves another":
        fixed = apply_edits(sample.path.read_text(), found.fix.edits)
        assert [d.code for d in check_text(fixed, str(sample.path))] == ["BX007"]


@pytest.mark.parametrize("sample", [s for s in SAMPLES.values() if s.fixed], ids=lambda s: s.name)
def test_fixed_twins_are_silent(sample):
    assert check_file(sample.fixed) == []


# Real-world twins the checker still flags, and why.
TWINS_FLAGGED = {
    "real/infini_attention_memory": "the attention returns `self.memory.detach()` two modules down, and the "
                                    "checker does not follow `outputs.memory` into the model",
}


@pytest.mark.parametrize("sample", [
    pytest.param(s, marks=pytest.mark.xfail(reason=TWINS_FLAGGED[s.name], strict=True)) if s.name in TWINS_FLAGGED
    else s for s in manifest.real_cases() + manifest.library_cases() if s.fixed], ids=lambda s: s.name)
def test_real_fixed_twins_are_silent(sample):
    assert check_file(sample.fixed) == []


@pytest.mark.parametrize("sample", [s for s in SAMPLES.values() if s.kind == "none" and s.name not in SILENTLY_WRONG],
                         ids=lambda s: s.name)
def test_clean_scenarios_are_silent(sample):
    assert check_file(sample.path) == []


@pytest.mark.parametrize("name", sorted(SILENTLY_WRONG))
def test_silently_wrong_scenarios_are_flagged(name):
    code, line = SILENTLY_WRONG[name]
    path = SAMPLES[name].path
    row = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() == line)
    assert [(d.code, d.location.row) for d in check_file(path)] == [(code, row)]


def invalid_case(name: str) -> tuple[str, str]:
    """The code of the rule whose INVALID case is called `name`, and the case's text."""
    return next((rule.CODE, case.code) for rule in RULES for case in rule.INVALID if case.name == name)


def test_the_pre_0_4_retain_variables_goes_with_the_update_moved_after_the_generators():
    """`G_loss` is made before `opt_D.step()` and the graph is kept for it: D's update moves after
    G's, and the moved backward loses `retain_variables=True`, which today's backward rejects."""
    code, text = invalid_case("a GAN written before PyTorch 0.4, with retain_variables")
    (found,) = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    patched = apply_edits(textwrap.dedent(text), found.fix.edits)
    assert found.fix.applicability == "safe" and "retain_variables" not in patched
    assert "G_loss.backward(retain_graph=True)" in patched and patched.index("opt_G.step()") < patched.index(
        "D_loss.backward(inputs=[p for group in opt_D.param_groups for p in group['params']])")


def test_a_state_that_starts_as_none_is_detached_only_once_it_exists():
    code, text = invalid_case("an LSTM state that starts as None")
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == [
        "    if state is not None:\n        state = tuple(h.detach() for h in state)\n"]


def test_a_module_state_that_starts_as_none_is_detached_only_once_it_exists():
    code, text = invalid_case("an LSTM state kept on the module, starting as None")
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == [
        "        if self.hidden is not None:\n"
        "            self.hidden = tuple(h.detach() for h in self.hidden)\n"]


def test_a_tensor_the_next_optimizer_does_not_train_is_detached_for_its_update():
    code, text = invalid_case("an advantage shared by the critic and the actor updates")
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == ["advantage.detach()"]
    assert "`actor_opt.step()`" in found[0].fix.message


def test_a_total_read_as_a_tensor_is_added_up_detached_not_as_a_number():
    code, text = invalid_case("a total logged with .item() (ML2021)")
    (found,) = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found.fix.edits] == ["output.loss.detach()"]
    assert found.fix.applicability == "safe"


def test_a_value_extended_after_the_backward_is_kept_detached_whole():
    code, text = invalid_case("predictions appended to a rollout after the backward")
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == ["torch.cat([history, pred], 0).detach()"]


def test_a_second_backward_of_the_same_loss_is_removed_not_summed():
    code, text = invalid_case("the same loss back-propagated again under a condition")
    text = textwrap.dedent(text)
    found = [d for d in check_text(text, "variant.py") if d.code == code]
    assert found[0].location.row == 7 and "back-propagated twice" in found[0].message
    assert apply_edits(text, found[0].fix.edits) == text.replace(
        "if log_gradients:\n        loss.backward()", "if log_gradients:\n        pass")


def test_a_snapshot_of_a_model_the_loop_calls_again_is_kept_detached():
    code, text = invalid_case("PPO's old log-probabilities computed once, with history")
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == ["dist.log_prob(actions).detach()"]


def test_a_running_total_is_one_finding_not_also_a_carried_state():
    from explainer.static.rules.bx002_running_total import TOTAL_OF_AN_ATTRIBUTE

    assert [f.code for f in check_text(textwrap.dedent(TOTAL_OF_AN_ATTRIBUTE), "a.py")] == ["BX002"]


def test_every_rule_flags_some_sample_or_variant():
    flagged = {d.code for s in SAMPLES.values() for d in check_file(s.path)}
    flagged |= {rule.CODE for rule in RULES if rule.INVALID}
    assert flagged == {rule.CODE for rule in RULES}


def test_noqa_select_and_ignore():
    code = textwrap.dedent("""
        for x in batches:
            hidden.detach()
            out, hidden = model(x, hidden)
            out.sum().backward()
    """)
    assert [d.code for d in check_text(code, "a.py")] == ["BX003", "BX001"]
    assert [d.code for d in check_text(code, "a.py", select=["BX003"])] == ["BX003"]
    assert [d.code for d in check_text(code, "a.py", ignore=["BX003"])] == ["BX001"]
    silenced = code.replace("hidden.detach()", "hidden.detach()  # noqa: BX003")
    assert [d.code for d in check_text(silenced, "a.py")] == ["BX001"]
    assert check_text(silenced.replace("model(x, hidden)", "model(x, hidden)  # noqa"), "a.py") == []


def test_the_editors_ignore_edit_silences_the_code_as_check_reads_it():
    """editor.noqa_edit (the language server's "Ignore BX001 on this line"): appended to the
    line, added to a noqa comment that names other codes, never on a backslash-continued line,
    and nothing when the line already silences the code."""
    from explainer import editor
    from explainer.fixes.edits import apply_edits

    code = textwrap.dedent("""
        for x in batches:
            hidden.detach()  # noqa: BX003
            out, hidden = model(x, hidden)  # the state
            out.sum().backward()
    """)
    found = check_text(code, "a.py")
    (carried,) = [d for d in found if d.code == "BX001"]
    lines = code.splitlines(keepends=True)
    edit = editor.noqa_edit(carried, lines[carried.location.row - 1])
    silenced = apply_edits(code, [edit])
    assert "out, hidden = model(x, hidden)  # the state  # noqa: BX001\n" in silenced
    assert check_text(silenced, "a.py") == []
    # A second code joins the noqa already there.
    both = code.replace("hidden.detach()  # noqa: BX003", "hidden.detach()  # noqa: BX999")
    (discarded,) = [d for d in check_text(both, "a.py") if d.code == "BX003"]
    joined = apply_edits(both, [editor.noqa_edit(discarded, both.splitlines(keepends=True)[discarded.location.row - 1])])
    assert "hidden.detach()  # noqa: BX999, BX003\n" in joined
    assert editor.noqa_edit(discarded, "    hidden.detach()  # noqa\n") is None
    assert editor.noqa_edit(discarded, "    hidden.detach()  # noqa: BX003\n") is None
    assert editor.noqa_edit(discarded, "    x = hidden.detach() + \\\n") is None


def run_check(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "explainer", "check", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})


@pytest.mark.parametrize("env, colored", [
    ({}, False),  # a pipe: no colour
    ({"FORCE_COLOR": "1"}, True),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),  # NO_COLOR wins
    ({"FORCE_COLOR": "0"}, False),
])
def test_check_text_is_coloured_as_the_terminal_and_the_environment_say(env, colored):
    shown = subprocess.run([sys.executable, "-m", "explainer", "check", "samples/rnn_hidden_chunks.py"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={"PYTHONPATH": str(ROOT), "PATH": "", **env})
    assert ("\x1b[" in shown.stdout) is colored
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout)
    assert plain.startswith("samples/rnn_hidden_chunks.py:19:10: BX001 [*] `hidden`")
    if colored:
        assert "\x1b[1;31mBX001\x1b[0m \x1b[36m[*]\x1b[0m" in shown.stdout
    assert shown.returncode == 1


def test_check_text_is_coloured_on_a_terminal():
    import os
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "explainer", "check", "samples/rnn_hidden_chunks.py"],
                              stdout=follower, stderr=subprocess.DEVNULL, cwd=ROOT, timeout=120,
                              env={"PYTHONPATH": str(ROOT), "PATH": "", "TERM": "xterm"})
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: everything is read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 1 and b"\x1b[1;31mBX001\x1b[0m" in shown


def test_cli_json_shape_and_exit_codes(tmp_path):
    flagged = run_check("--format", "json", "samples/rnn_hidden_chunks.py")
    assert flagged.returncode == 1
    (diagnostic,) = json.loads(flagged.stdout)
    assert set(diagnostic) == {"code", "message", "filename", "location", "end_location", "fix", "url"}
    assert diagnostic["url"].startswith("file://") and diagnostic["url"].endswith("/BX001.md")
    assert (diagnostic["location"], diagnostic["end_location"]) == ({"row": 19, "column": 10}, {"row": 19, "column": 16})
    clean = run_check("samples/rnn_hidden_chunks_fixed.py")
    assert (clean.returncode, clean.stdout.strip()) == (0, "All checks passed.")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    # A file that does not parse is a diagnostic (BX000) at the parser's position, as ruff
    # reports one; the other files are checked all the same, and the run exits 1.
    failed = run_check("--format", "json", str(broken), "samples/rnn_hidden_chunks.py")
    assert failed.returncode == 1 and not failed.stderr
    assert [(d["code"], d["filename"], d["location"]) for d in json.loads(failed.stdout)] == [
        ("BX000", str(broken), {"row": 1, "column": 7}), ("BX001", "samples/rnn_hidden_chunks.py", {"row": 19, "column": 10})]
    assert "does not parse" in json.loads(failed.stdout)[0]["message"]
    python2 = tmp_path / "python2.py"
    python2.write_text("for x in data:\n    print x\n")
    text = run_check(str(python2), "samples/rnn_hidden_chunks_fixed.py")
    assert text.returncode == 1 and f"{python2.name}:2:5: BX000 " in text.stdout and "All checks passed" not in text.stdout
    assert run_check("--ignore", "BX000", str(python2)).returncode == 0
    unknown = run_check("--select", "BX001,NOPE1", "samples/")
    assert unknown.returncode == 2 and "unknown rule code 'NOPE1'" in unknown.stderr and not unknown.stdout
    assert run_check("--ignore", "ZZZ", "samples/").returncode == 2
    assert run_check("--select", "bx00", "samples/rnn_hidden_chunks_fixed.py").returncode == 0
    assert run_check("no/such/path.py").returncode == 2


def test_files_are_decoded_as_python_does(tmp_path):
    latin = tmp_path / "latin.py"
    latin.write_bytes("# -*- coding: latin-1 -*-\n# café\nfor x in data:\n    h = m(x, h)\n    h.sum().backward()\n".encode("latin-1"))
    undecodable = tmp_path / "bad.py"
    undecodable.write_bytes(b"x = '\xff'\n")
    result = run_check("--format", "json", str(latin), str(undecodable))
    assert [d["code"] for d in json.loads(result.stdout)] == ["BX001"]
    assert result.returncode == 2 and "bad.py: cannot read" in result.stderr


def test_text_format_is_ruff_like():
    out = run_check("samples/running_loss_total.py").stdout
    assert out.splitlines()[0].startswith("samples/running_loss_total.py:15:5: BX002 ")
    assert "15 |     total = total + loss  # culprit" in out and "= fix:" in out


def test_check_never_imports_the_code_it_reads(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nimport train\n")
    (tmp_path / "train.py").write_text("import evil\nfor x in data:\n    h = m(x, h)\n    h.sum().backward()\n")
    result = run_check(str(tmp_path))
    assert result.returncode == 1 and not marker.exists()


def test_rule_command_prints_the_docs():
    shown = subprocess.run([sys.executable, "-m", "explainer", "rule", "bx002"], capture_output=True,
                           text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert shown.returncode == 0 and "## Use instead" in shown.stdout


def write_notebook(path, cells, language="python"):
    """A notebook as Jupyter saves it (nbformat 4, indent 1), from (cell_type, source) pairs."""
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "language": language, "display_name": "Python 3"}
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    notebook.cells = [make[kind](textwrap.dedent(source).strip("\n")) for kind, source in cells]
    nbformat.write(notebook, str(path))
    return path


RNN_NOTEBOOK = [
    ("markdown", "# Truncated BPTT"),
    ("code", """
        %matplotlib inline
        import torch
        rnn = torch.nn.RNNCell(3, 4)
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
        hidden = torch.zeros(1, 4)
    """),
    ("code", """
        !nvidia-smi
        for step in range(3):
            x = torch.randn(1, 3)
            hidden = rnn(x, hidden)
            files = !ls
            loss = hidden.pow(2).sum()
            loss.backward()
            rnn?
            opt.step()
    """),
    ("code", """
        %%bash
        if then fi
    """),
]


def test_notebook_cells_are_one_module_with_ipython_lines_skipped(tmp_path):
    notebook = write_notebook(tmp_path / "rnn.ipynb", RNN_NOTEBOOK)
    result = run_check("--format", "json", str(notebook))
    assert result.returncode == 1, result.stderr
    (diagnostic,) = json.loads(result.stdout)
    # Cells count as the notebook shows them, the markdown cell included; rows within the cell.
    assert (diagnostic["code"], diagnostic["cell"], diagnostic["location"]) == ("BX001", 3, {"row": 4, "column": 5})
    assert diagnostic["fix"]["edits"][0]["cell"] == 3
    text = run_check(str(notebook)).stdout
    assert f"{notebook.name}:cell 3:4:5: BX001" in text.replace(str(tmp_path) + "/", "")
    assert "4 |     hidden = rnn(x, hidden)" in text


def test_a_notebook_finding_has_the_same_cell_in_check_and_in_the_editor(tmp_path):
    """`cell` has one meaning: the notebook's own numbering, markdown cells included. The editor
    gets the notebook's cells in order (None for a markdown cell), as a language server has them."""
    from explainer.editor import Settings, check_cells

    notebook = write_notebook(tmp_path / "rnn.ipynb", RNN_NOTEBOOK)
    (checked,) = json.loads(run_check("--format", "json", str(notebook)).stdout)
    cells = [textwrap.dedent(text).strip("\n") if kind == "code" else None for kind, text in RNN_NOTEBOOK]
    per_cell = check_cells(cells, str(notebook), Settings())
    assert [len(found) for found in per_cell] == [0, 0, 1, 0]
    (editor_finding,) = per_cell[2]
    assert editor_finding.to_check_json() == checked
    assert editor_finding.cell == checked["cell"] == 3 and editor_finding.fix.edits[0].cell == 3


def test_notebook_cell_that_does_not_parse_is_skipped_and_reported(tmp_path):
    notebook = write_notebook(tmp_path / "broken.ipynb", [*RNN_NOTEBOOK, ("code", "def broken(:\n    pass")])
    result = run_check("--format", "json", str(notebook))
    assert sorted((d["code"], d["cell"], d["location"]["row"]) for d in json.loads(result.stdout)) == [
        ("BX000", 5, 1), ("BX001", 3, 4)]
    assert result.returncode == 1 and not result.stderr
    (tmp_path / "bad.ipynb").write_text("{not json")
    (tmp_path / "r.ipynb").write_text(json.dumps({"cells": [], "metadata": {"kernelspec": {"language": "R"}}}))
    bad = run_check(str(tmp_path / "bad.ipynb"), str(tmp_path / "r.ipynb"))
    assert bad.returncode == 2 and "invalid JSON" in bad.stderr and "not a Python notebook" in bad.stderr


def test_fix_rewrites_python_files_and_reports_what_is_left(tmp_path):
    for name in ("rnn_hidden_chunks", "gan_fake_reuse", "running_loss_total"):
        (tmp_path / f"{name}.py").write_bytes((ROOT / "samples" / f"{name}.py").read_bytes())
    (tmp_path / "clean.py").write_bytes((ROOT / "samples" / "rnn_hidden_chunks_fixed.py").read_bytes())
    before = (tmp_path / "clean.py").stat().st_mtime_ns
    result = run_check("--fix", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("(3 fixed, 0 remaining).")
    assert run_check(str(tmp_path)).returncode == 0
    assert (tmp_path / "clean.py").stat().st_mtime_ns == before  # untouched files are not rewritten
    for name in ("rnn_hidden_chunks", "gan_fake_reuse", "running_loss_total"):
        compile((tmp_path / f"{name}.py").read_text(), name, "exec")


def test_diff_prints_what_fix_would_change_and_writes_nothing(tmp_path):
    buggy = tmp_path / "running_loss_total.py"
    buggy.write_bytes((ROOT / "samples" / "running_loss_total.py").read_bytes())
    clean = tmp_path / "clean.py"
    clean.write_bytes((ROOT / "samples" / "rnn_hidden_chunks_fixed.py").read_bytes())
    before = buggy.read_bytes()
    result = run_check("--diff", str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert f"--- {buggy}\n+++ {buggy}\n" in result.stdout
    assert "-    total = total + loss  # culprit" in result.stdout
    assert "+    total = total + loss.item()  # culprit" in result.stdout
    assert result.stdout.rstrip().endswith("Would apply 1 fix.") and "clean.py" not in result.stdout
    assert buggy.read_bytes() == before
    result = run_check("--diff", str(clean))
    assert result.returncode == 0 and result.stdout.strip() == "No fixes would be applied."


# The loss is made by a function the file cannot see into, and only a `.detach()` cuts it: the
# checker finds the loss has no history, but removing the cut changes what trains (A3C's detached
# bootstrap value was such a cut), so that fix is applied only on request.
CUT_LOSS = """
import torch
model = torch.nn.Linear(3, 1)
for x, y in batches:
    out = model(x).detach()
    loss = ((out - y) ** 2).mean()
    loss.backward()
"""


def test_an_argmax_inside_the_model_is_named_without_a_fix():
    """A loss on the index a model's forward returns cannot train through it: the diagnostic
    points into `forward`, and offers no fix (the loss itself must change)."""
    code = textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(x).argmax(-1).float()

        model = Net()
        for x, y in batches:
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
    """)
    [found] = check_text(code, "argmax.py")
    assert (found.code, found.location.row, found.fix) == ("BX009", 11, None)
    assert "`model(x)` returns a value cut from the graph by `.argmax()` (line 11, in `Net.forward`)" in found.message


def test_unsafe_fixes_are_shown_and_applied_only_with_unsafe_fixes(tmp_path):
    script = tmp_path / "cut.py"
    script.write_text(CUT_LOSS)
    shown = run_check(str(script))
    assert "BX009 `out`" in shown.stdout and " = unsafe fix: " in shown.stdout
    assert "\nNo fixes available (1 hidden fix can be enabled with the `--unsafe-fixes` option).\n" in shown.stdout
    assert run_check("--fix", str(script)).returncode == 1 and script.read_text() == CUT_LOSS
    assert "BX009 [*] `out`" in run_check("--unsafe-fixes", str(script)).stdout
    result = run_check("--fix", "--unsafe-fixes", str(script))
    assert result.returncode == 0 and "(1 fixed, 0 remaining)" in result.stdout
    assert "out = model(x)\n" in script.read_text()


def test_statistics_count_each_code(tmp_path):
    for name in ("rnn_hidden_chunks", "gan_fake_reuse", "running_loss_total"):
        (tmp_path / f"{name}.py").write_bytes((ROOT / "samples" / f"{name}.py").read_bytes())
    (tmp_path / "cut.py").write_text(CUT_LOSS)
    result = run_check("--statistics", str(tmp_path))
    assert result.returncode == 1
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert rows == [["1", "BX001", "[*] carried-state"], ["1", "BX002", "[*] running-total"],
                    ["1", "BX006", "[*] shared-graph"], ["1", "BX009", "[ ] loss-without-history"]]


def test_a_fix_is_safe_only_where_the_source_shows_a_tensor(tmp_path):
    """`.detach()` / `.item()` on a value made by a function the file cannot see into may land
    on a Python number or a tuple: such fixes are unsafe. A term that is itself back-propagated
    is a tensor, whatever made it."""
    script = tmp_path / "unknown.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(3, 1)
        total = 0
        for x in batches:
            state = advance(state, x)
            loss = compute_loss(model, x, state)
            loss.backward()
            total = total + loss
    """))
    found = {d["code"]: d["fix"]["applicability"] for d in json.loads(run_check("--format", "json", str(script)).stdout)}
    assert found == {"BX001": "unsafe", "BX002": "safe"}


def test_fix_rewrites_only_the_fixed_lines_of_a_notebook(tmp_path):
    notebook = write_notebook(tmp_path / "rnn.ipynb", [*RNN_NOTEBOOK, ("code", "def broken(:\n    pass")])
    original = notebook.read_text()
    result = run_check("--fix", str(notebook))
    # The cell that does not parse is what remains: BX000, in cell 5, untouched.
    assert "(1 fixed, 1 remaining)" in result.stdout and ":cell 5:1:12: BX000 " in result.stdout
    changed = [(a, b) for a, b in zip(original.splitlines(), notebook.read_text().splitlines()) if a != b]
    assert changed == [('    "    hidden = rnn(x, hidden)\\n",', '    "    hidden = rnn(x, hidden.detach())\\n",')]


def test_editor_fix_all_in_a_notebook_changes_only_the_fixed_cell():
    """What the language server's "Fix all" on a notebook applies: the cells as one module, the
    IPython lines and a cell that does not parse kept as they were, no newline added."""
    from explainer.editor import Settings, fix_all_cells

    cells = ["import torch\nrnn = torch.nn.RNNCell(3, 4)\nhidden = torch.zeros(1, 4)",
             "%matplotlib inline\nfor step in range(3):\n    hidden = rnn(torch.randn(1, 3), hidden)\n"
             "    files = !ls\n    hidden.sum().backward()",
             "def broken(:\n    pass"]
    fixed = fix_all_cells(cells, "train.ipynb", Settings())
    assert fixed == [cells[0], cells[1].replace("rnn(torch.randn(1, 3), hidden)", "rnn(torch.randn(1, 3), hidden.detach())"),
                     cells[2]]
    assert fix_all_cells(fixed, "train.ipynb", Settings()) is None  # nothing left to fix
    assert fix_all_cells(cells, "train.ipynb", Settings(ignore=("BX001",))) is None
    assert fix_all_cells(cells, "train.ipynb", Settings(enable=False)) is None


def test_editor_fix_all_in_a_cell_applies_only_the_fixes_inside_it():
    """VS Code fixes each cell on its own on save: a cell gets the fixes whose edits all lie in it,
    and a fix that moves a line from one cell into another is left to the notebook's fix-all."""
    from explainer.editor import Settings, fix_all_cells, fix_all_in_cell

    setup = "import torch\nw = torch.randn(5, requires_grad=True)\nopt = torch.optim.SGD([w], lr=0.1)\n" \
            "w_hat = w / w.norm()\nrnn = torch.nn.RNNCell(3, 4)\nhidden = torch.zeros(1, 4)\n"
    moved = "for step in range(3):\n    loss = (w_hat * torch.randn(5)).sum()\n    opt.zero_grad()\n" \
            "    loss.backward()\n    opt.step()\n"
    carried = "%matplotlib inline\nfor step in range(3):\n    hidden = rnn(torch.randn(1, 3), hidden)\n" \
              "    hidden.sum().backward()"
    cells = [setup, moved, carried, "def broken(:\n    pass"]
    whole = fix_all_cells(cells, "train.ipynb", Settings())
    assert "w_hat" not in whole[0] and "    w_hat = w / w.norm()\n" in whole[1]  # the cross-cell fix
    assert [fix_all_in_cell(cells, n, "train.ipynb", Settings()) for n in (1, 2, 4)] == [None, None, None]
    assert fix_all_in_cell(cells, 3, "train.ipynb", Settings()) == whole[2] == \
        carried.replace("rnn(torch.randn(1, 3), hidden)", "rnn(torch.randn(1, 3), hidden.detach())")
    # Once the cross-cell fix is in (cell 2 now starts a row further down): the same fix.
    grown = [whole[0], whole[1], carried, cells[3]]
    assert fix_all_in_cell(grown, 3, "train.ipynb", Settings()) == whole[2]
    assert fix_all_in_cell(cells, 3, "train.ipynb", Settings(enable=False)) is None


def test_sarif_output(tmp_path):
    result = run_check("--format", "sarif", "samples/gan_fake_reuse.py", "samples/rnn_hidden_chunks_fixed.py")
    assert result.returncode == 1
    sarif = json.loads(result.stdout)
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    (run,) = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [cause.code for cause in CAUSES]
    # No machine path in a file meant to be uploaded: the page itself is `help`, and this
    # package names no documentation site, so there is no `helpUri` at all.
    assert "file://" not in result.stdout.replace(sarif["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"], "")
    assert all("helpUri" not in r and "## Use instead" in r["help"]["markdown"] for r in rules)
    (found,) = run["results"]
    assert found["ruleId"] == "BX006" and rules[found["ruleIndex"]]["id"] == "BX006"
    location = found["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "samples/gan_fake_reuse.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 22, "startColumn": 5, "endLine": 22, "endColumn": 9}
    # The fix, applied from SARIF's replacements alone, gives the script the JSON fix gives.
    (change,) = found["fixes"][0]["artifactChanges"]
    edits = [Edit("x", r["insertedContent"]["text"],
                  Location(r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"]),
                  Location(r["deletedRegion"]["endLine"], r["deletedRegion"]["endColumn"]))
             for r in change["replacements"]]
    (diagnostic,) = json.loads(run_check("--format", "json", "samples/gan_fake_reuse.py").stdout)
    text = (ROOT / "samples" / "gan_fake_reuse.py").read_text()
    assert apply_edits(text, edits) == apply_edits(text, Fix.from_json(diagnostic["fix"]).edits)


def test_jedi_follows_workspace_imports_without_importing_them(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ws'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "models.py").write_text(textwrap.dedent(f"""
        import torch.nn as nn
        open({str(marker)!r}, "w").write("imported")
        class Base(nn.Module):
            pass
        class Net(Base):
            def forward(self, x):
                return x
        def build_model():
            return Net()
        def load_data():
            return [1, 2, 3]
        class Schedule:
            def __call__(self, progress):
                return 0.2 * progress
    """))
    train = textwrap.dedent("""
        import torch
        from pkg.models import build_model as make, load_data
        model = FACTORY()
        optimizer = torch.optim.LBFGS(model.parameters())
        for step in range(3):
            pred = model(torch.randn(4, 3))
            def closure():
                optimizer.zero_grad()
                loss = (pred - 1).pow(2).mean()
                loss.backward()
                return loss
            optimizer.step(closure)
    """)
    (tmp_path / "train.py").write_text(train.replace("FACTORY", "make"))
    (tmp_path / "data.py").write_text(train.replace("FACTORY", "load_data"))
    # A class imported from the workspace is taken for a model only if jedi does not find it is
    # none (stable-baselines3's clip-range schedule, called once before its update loop).
    (tmp_path / "ppo.py").write_text(textwrap.dedent("""
        import torch
        from pkg.models import CLASS

        class PPO:
            def __init__(self, policy):
                self.policy = policy
                self.clip_range = CLASS()
                self.optimizer = torch.optim.Adam(policy.parameters())

            def train(self, batches):
                clip_range = self.clip_range(0.5)
                for obs, advantages in batches:
                    ratio = self.policy(obs)
                    loss = -torch.clamp(ratio, 1 - clip_range, 1 + clip_range).mul(advantages).mean()
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
    """).replace("CLASS", "Schedule"))
    files = [str(tmp_path / "train.py"), str(tmp_path / "data.py"), str(tmp_path / "ppo.py")]
    result = run_check("--format", "json", *files)
    found = [(Path(d["filename"]).name, d["code"], d["location"]["row"]) for d in json.loads(result.stdout)]
    assert found == [("train.py", "BX004", 7)]
    (tmp_path / "ppo.py").write_text((tmp_path / "ppo.py").read_text().replace("Schedule", "Net"))
    result = run_check("--format", "json", *files)
    found = [(Path(d["filename"]).name, d["code"], d["location"]["row"]) for d in json.loads(result.stdout)]
    assert found == [("train.py", "BX004", 7), ("ppo.py", "BX004", 12)]
    assert not marker.exists()


def test_a_state_reset_by_a_method_of_a_workspace_base_class_is_not_carried(tmp_path):
    """pymarl: `NMAC(BasicMAC)` re-assigns `self.hidden_states` in its forward; BasicMAC, in
    another file, starts it afresh in `init_hidden`, which the learner calls per batch. jedi finds
    the base class (reading it, never importing it); without that file the state is flagged."""
    marker = tmp_path / "imported"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ws'\n")
    (tmp_path / "controllers").mkdir()
    (tmp_path / "controllers" / "__init__.py").write_text("")
    base = tmp_path / "controllers" / "basic_controller.py"
    base.write_text(textwrap.dedent(f"""
        open({str(marker)!r}, "w").write("imported")
        class BasicMAC:
            def __init__(self, agent):
                self.agent = agent
                self.hidden_states = None

            def init_hidden(self, batch_size):
                self.hidden_states = self.agent.init_hidden().expand(batch_size, -1)
    """))
    controller = tmp_path / "controllers" / "n_controller.py"
    controller.write_text(textwrap.dedent("""
        import torch.nn as nn
        from .basic_controller import BasicMAC

        class NMAC(BasicMAC):
            def forward(self, inputs):
                agent_outs, self.hidden_states = self.agent(inputs, self.hidden_states)
                return agent_outs
    """))
    result = run_check("--format", "json", str(controller))
    assert json.loads(result.stdout) == []
    base.unlink()
    result = run_check("--format", "json", str(controller))
    assert [(d["code"], d["location"]["row"]) for d in json.loads(result.stdout)] == [("BX001", 7)]
    assert not marker.exists()


def test_a_loss_added_up_by_a_tracker_of_another_workspace_file_is_found(tmp_path):
    """An `AverageMeter` in the project's utils.py (LIC-HPCM's issue #4 keeps it in another file)
    adds up whatever it is given: fed the loss, it keeps every step's graph. jedi reads the class
    (never imports it); given `.item()`, or once the tracker takes the number out itself, nothing
    is flagged."""
    marker = tmp_path / "imported"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ws'\n")
    utils = tmp_path / "utils.py"
    meter = textwrap.dedent(f"""
        open({str(marker)!r}, "w").write("imported")

        class AverageMeter:
            def __init__(self):
                self.sum = 0
                self.count = 0

            def update(self, val, n=1):
                self.sum += val * n
                self.count += n
    """)
    utils.write_text(meter)
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""
        import torch
        from utils import AverageMeter

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = AverageMeter()
        for x in torch.randn(10, 2, 4):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.update(loss, x.size(0))
    """))
    result = run_check("--format", "json", str(train))
    found = json.loads(result.stdout)
    assert [(d["code"], d["location"]["row"], d["location"]["column"]) for d in found] == [("BX002", 13, 19)]
    assert "`losses.update` adds `loss`" in found[0]["message"] and "`losses.sum`" in found[0]["message"]
    assert found[0]["fix"]["applicability"] == "safe" and found[0]["fix"]["edits"][0]["content"] == "loss.detach()"
    utils.write_text(meter.replace("        self.sum += val * n\n",
                                   "        if torch.is_tensor(val):\n            val = val.item()\n"
                                   "        self.sum += val * n\n"))
    assert json.loads(run_check("--format", "json", str(train)).stdout) == []
    assert not marker.exists()


def test_checks_in_several_threads_agree_with_one_at_a_time():
    """The language server checks in worker threads; parsed trees share their context and
    operator nodes (`Load`, `Add`), which the checker must not write to."""
    import threading

    from explainer import editor

    sources = [(str(s.path), s.path.read_text()) for s in manifest.samples()]

    def codes_of_all() -> list[list[tuple[str, int]]]:
        return [[(d.code, d.location.row) for d in editor.check_document(text, path, editor.Settings()) or []]
                for path, text in sources]

    expected = codes_of_all()
    results, failures = [], []

    def work() -> None:
        try:
            for _ in range(2):
                results.append(codes_of_all())
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(repr(error))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert all(result == expected for result in results) and len(results) == 12


def test_sarif_links_rules_to_the_documentation_site_the_package_names(monkeypatch):
    import importlib.metadata

    from explainer.render.sarif import render_sarif

    class Metadata:
        def get_all(self, key):
            assert key == "Project-URL"
            return ["Homepage, https://example.org", "Documentation, https://example.org/rules/"]

    monkeypatch.setattr(importlib.metadata, "metadata", lambda name: Metadata())
    rules = json.loads(render_sarif([]))["runs"][0]["tool"]["driver"]["rules"]
    assert [r["helpUri"] for r in rules][:2] == ["https://example.org/rules/BX000.md", "https://example.org/rules/BX001.md"]


def test_sarif_points_notebook_results_at_the_rows_of_the_file_that_hold_the_cells_lines(tmp_path):
    """A SARIF region is rows of the file's text: a notebook's result points at the row of its
    JSON that holds the cell's line (Jupyter writes one source line per row), a cell that does
    not parse too."""
    notebook = write_notebook(tmp_path / "rnn.ipynb", [*RNN_NOTEBOOK, ("code", "x = 1\ndef broken(:\n    pass")])
    result = run_check("--format", "sarif", str(notebook))
    rows = notebook.read_text().splitlines()
    found = {r["ruleId"]: r["locations"][0]["physicalLocation"]["region"] for r in json.loads(result.stdout)["runs"][0]["results"]}
    assert found["BX001"]["startLine"] == found["BX001"]["endLine"]
    assert '"    hidden = rnn(x, hidden)\\n",' in rows[found["BX001"]["startLine"] - 1]
    assert '"def broken(:\\n",' in rows[found["BX000"]["startLine"] - 1]


@pytest.mark.parametrize("raw, rows", [
    ('{"cells": [{"cell_type": "code", "source": ["a = 1\\n", "b = 2"]}]}', {1: [1, 1]}),
    ('{"cells": [\n {"source": "# md", "cell_type": "markdown"},\n {"source": [\n  "a\\n",\n  "b"\n ]}\n]}',
     {1: [2], 2: [4, 5]}),
    ('{"cells": [{"source": "one\\ntwo"}]}', {1: [1, 1]}),
    ("{not json", {}),
])
def test_source_lines_are_found_in_the_notebook_file(raw, rows):
    from explainer.reading.notebook import source_lines_in_file

    assert source_lines_in_file(raw) == rows


def test_an_in_place_change_the_checker_and_the_run_both_see_is_one_bug(explain_run, tmp_path):
    """RefineNet's `x += path` after an in-place ReLU and a max-pool of the same tensor: the
    checker names the ReLU's output (line 80), the run the max-pool's input (line 84), and both the
    line that changed it (85). The editor shows one diagnostic, confirmed by the run."""
    from explainer import editor
    from explainer.model import Finding

    sample = {s.name: s for s in manifest.real_cases()}["real/refinenet_crp_inplace_add"]
    static = [f for f in check_file(sample.path) if f.code == "BX011"]
    ran = [Finding.from_json(f) for f in explain_run(sample.path).findings]
    assert [(f.location.row, f.evidence.made_at.row) for f in static] == [(80, 85)]
    assert [(f.code, [c.location.row for c in f.culprits]) for f in ran] == [("BX011", [84, 85])]
    (shown,) = editor.one_per_bug(static, ran)
    assert shown.confirmed and shown.location.row == 80


def test_a_state_that_may_be_a_named_tuple_is_not_cut_as_safe():
    """The state starts as None and the file makes named tuples (titans-pytorch's
    `NeuralMemState`): `.detach()` may not exist on it, so the cut is offered as unsafe."""
    from explainer.static.rules import bx001_carried_state

    case = next(c for c in bx001_carried_state.INVALID if "named tuples" in c.name)
    found = [f for f in check_text(textwrap.dedent(case.code), "invalid.py") if f.code == "BX001"]
    assert [f.fix.applicability for f in found] == ["unsafe"]
    plain = textwrap.dedent(case.code).replace('State = namedtuple("State", ["index", "weights"])\n', "").replace(
        'State(0, {"w": weights * 0.5})', "weights * 0.5").replace("state.weights", "state")
    assert [f.fix.applicability for f in check_text(plain, "valid.py") if f.code == "BX001"] == ["safe"]
