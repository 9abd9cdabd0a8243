"""`pdtop tune --launch`: real server processes (a stand-in server script, and `pdtop serve`)
started, loaded over HTTP, and stopped per candidate; nothing left running, ever."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdtop.cli import main
from pdtop.tune.score import HttpRun, HttpSample, Slo, score_http

STANDIN = Path(__file__).with_name("standin_server.py")
SLO_MS = "500"  # loose: the stand-in streams a token every 5 ms; a loaded machine's stall must not fail a test
ROOT = Path(__file__).resolve().parents[2]
SMALL = "decode_bs=2,decode_prompt=16,long_tokens=64,long_prompts=2,decode_tokens=8"


def standin(tmp: Path, *extra: str) -> str:
    return (f"{sys.executable} {STANDIN} --config {{config}} --port {{port}} --pid-file {tmp / 'pids'} "
            + " ".join(extra))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def pids(tmp: Path) -> list[int]:
    path = tmp / "pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return [p for p in out if alive(p)]


def tune(tmp: Path, command: str, *extra: str) -> tuple[int, dict]:
    """`pdtop tune --launch` on the small scenario: (exit code, its --json object or {})."""
    return tune_on(tmp, command, "--workload", SMALL, *extra)


def records(tmp: Path) -> list[dict]:
    lines = (tmp / "runs.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines[1:]]


def test_candidates_are_launched_measured_and_stopped(tmp_path):
    rc, out = tune(tmp_path, standin(tmp_path, "--child"), "--max-candidates", "3", "--out", str(tmp_path / "b.yaml"))
    assert rc in (0, 1)
    recs = records(tmp_path)
    assert len(recs) == 3 and all(r["ok"] for r in recs)
    assert recs[0]["config"] == recs[1]["config"]  # SGLang's default, twice: the noise
    assert recs[0]["config"]["split_forward_token_budget"] == 4096  # cpu's own budget, as measured
    assert all(any(s["long"] for s in r["samples"]) for r in recs)
    assert out["launch"]["reused"] == 0 and out["search"]["measured"] == 3
    logs = sorted(Path(out["launch"]["log_dir"]).glob("candidate-*.log"))
    assert len(logs) == 3 and "standin: fault ok" in logs[0].read_text()
    assert len(pids(tmp_path)) == 6  # each server and its child
    assert not [p for p in pids(tmp_path) if alive(p)]


def test_without_control_port_the_itl_is_each_requests_tpot_and_the_report_says_so_once(tmp_path, capsys):
    """No {control_port} in the command: no rounds to read, so the tables' column is TPOT p99 (each
    request's TPOT, as the samples give it) and one line of the report says why; so does stderr, once."""
    argv = ["tune", "--launch", standin(tmp_path), "--device", "cpu", "--slo-itl-ms", SLO_MS, "--workload", SMALL,
            "--max-candidates", "2", "--results", str(tmp_path / "runs.jsonl"), "--out", str(tmp_path / "b.yaml")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines, err = captured.out.splitlines(), captured.err.splitlines()
    why = "the command names no {control_port}, so the server's rounds cannot be read"
    assert [x for x in lines if why in x] == [f"ITL column: each request's TPOT p99; {why}"]
    assert [x for x in err if why in x] == [f"pdtop tune: TPOT p99 stands in for ITL p99: {why}"]
    assert any(x.split()[:4] == ["TPOT", "p99", "TTFT", "p99"] for x in lines)
    assert not any("(rounds)" in x for x in lines)
    recs = records(tmp_path)
    assert len(recs) == 2 and all(r["no_rounds"] == why and "rounds" not in r for r in recs)
    assert (tmp_path / "b.yaml").read_text().splitlines()[0].endswith(f"SLO TPOT p99 <= {SLO_MS} ms")


def test_a_crashed_or_unhealthy_candidate_is_recorded_and_the_search_goes_on(tmp_path):
    faults = tmp_path / "faults"
    faults.write_text("crash-start\nnever-healthy\ncrash-mid\nok\n")
    rc, out = tune(tmp_path, standin(tmp_path, "--faults", str(faults)), "--max-candidates", "4",
                   "--startup-timeout", "2")
    assert rc == 0  # the one that ran meets the SLO
    recs = records(tmp_path)
    assert [r["ok"] for r in recs] == [False, False, False, True]
    assert "exited with status 3 before it was ready" in recs[0]["reason"]
    assert "boom: the stand-in cannot load its model" in recs[0]["log_tail"]
    assert "not ready (/health answering 200) within 2 s" in recs[1]["reason"]
    assert "status 4" in recs[2]["reason"] and "boom: crashed mid-run" in recs[2]["log_tail"]
    assert len(out["launch"]["failures"]) == 3
    assert not [p for p in pids(tmp_path) if alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_pdtop_mid_search_leaves_no_server_running(tmp_path, sig):
    command = standin(tmp_path, "--child", "--gap-ms", "200")  # slow: the signal comes mid-run
    proc = subprocess.Popen([sys.executable, "-m", "pdtop", "tune", "--launch", command, "--device", "cpu",
                             "--slo-itl-ms", SLO_MS, "--workload", SMALL, "--results", str(tmp_path / "runs.jsonl")],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(pids(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pids(tmp_path)) == 2, proc.stderr.read() if proc.poll() is not None else "no server started"
        time.sleep(1.0)  # the server is up and being loaded
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + signal.SIGTERM), err
    assert not [p for p in pids(tmp_path) if alive(p)]
    if sig == signal.SIGINT:
        assert "interrupted after" in err and "no server left running" in err


def test_a_server_gets_sigterm_when_pdtop_is_killed_outright(tmp_path):
    """SIGKILL leaves pdtop no time to stop anything: the watchdog it started stops the server."""
    command = standin(tmp_path, "--gap-ms", "200")
    proc = subprocess.Popen([sys.executable, "-m", "pdtop", "tune", "--launch", command, "--device", "cpu",
                             "--slo-itl-ms", SLO_MS, "--workload", SMALL], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not pids(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids(tmp_path), "no server started"
        proc.kill()
        proc.wait(10)
        server = pids(tmp_path)[0]
        deadline = time.monotonic() + 10
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(server)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids(tmp_path):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_search_resumes_from_its_results(tmp_path):
    command = standin(tmp_path)
    tune(tmp_path, command, "--max-candidates", "2")
    assert len(records(tmp_path)) == 2
    assert (tmp_path / "runs.jsonl.optuna").exists()  # the search's study, beside the results
    _, out = tune(tmp_path, command, "--max-candidates", "2")
    assert out["launch"]["reused"] == 2 and out["search"]["launches"] == 2 and out["search"]["measured"] == 2
    recs = records(tmp_path)
    assert len(recs) == 4 and recs[2]["config"] != recs[0]["config"]  # new candidates, not the default again
    assert len(pids(tmp_path)) == 4
    _, out = tune(tmp_path, command, "--max-candidates", "1", "--slo-itl-ms", "400")  # another SLO: a new study
    assert out["launch"]["reused"] == 4 and out["search"]["launches"] == 1  # from --results, re-scored


def test_a_results_file_of_another_workload_is_refused_in_one_line(tmp_path, capsys):
    tune(tmp_path, standin(tmp_path), "--max-candidates", "1")
    capsys.readouterr()
    argv = ["tune", "--launch", standin(tmp_path), "--device", "cpu", "--slo-itl-ms", SLO_MS, "--workload",
            SMALL.replace("long_prompts=2", "long_prompts=3"), "--results", str(tmp_path / "runs.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "another command, workload or seed" in err
    (tmp_path / "bad.jsonl").write_text("not json\n")
    argv[-1] = str(tmp_path / "bad.jsonl")
    assert main(argv) == 2
    assert "line 1" in capsys.readouterr().err


def test_a_command_that_never_serves_stops_the_search_in_one_line(tmp_path, capsys):
    """Every launch failing from the first is the command's fault, not a configuration's: after 4,
    one line and exit 2, and the 4 are in --results."""
    argv = ["tune", "--launch", "sh -c 'echo no such server on $0; exit 7' {port}", "--device", "cpu",
            "--slo-itl-ms", SLO_MS, "--results", str(tmp_path / "runs.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pdtop tune: error: the first 4 launches all failed, so the command is wrong")
    assert "exited with status 7" in err[-1]
    assert [r["ok"] for r in records(tmp_path)] == [False] * 4


@pytest.mark.parametrize("quoted", ["'{config}'", '"{config}"', "{config}"])
def test_no_quoting_of_a_placeholder_runs_shell_text_from_a_directory_name(tmp_path, monkeypatch, quoted):
    """Issue 38 item 15: with `'{config}'` in the template, a log directory named `t;touch …;#` ran
    `touch`. The template is split into words first and each filled in as one argument, no shell."""
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / ('t";touch PWNED;#' if quoted.startswith('"') else "t;touch PWNED;#")
    command = standin(tmp_path).replace("{config}", quoted)
    rc, _ = tune(tmp_path, command, "--max-candidates", "1", "--log-dir", str(evil))
    assert not (tmp_path / "PWNED").exists()
    assert rc in (0, 1) and records(tmp_path)[0]["ok"]  # the server got the path as one argument
    assert str(evil / "candidate-001.yaml") in (evil / "candidate-001.log").read_text()


def test_a_shell_in_the_template_gets_no_shell_text(tmp_path, capsys):
    """A template that runs a shell itself would read a value as script text: refused in one line."""
    argv = ["tune", "--launch", "sh -c 'serve --config {config} --port {port}'", "--device", "cpu",
            "--slo-itl-ms", SLO_MS, "--log-dir", str(tmp_path / "a;b")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shell text" in err
    assert not list((tmp_path / "a;b").glob("candidate-*"))


@pytest.mark.parametrize("flags,said", [
    ("", "chunked prefill"), ("--chunked-prefill-size -1", "overlap schedule"),
    ("--chunked-prefill-size -1 --disable-overlap-schedule --pp-size 2", "--pp-size 2")])
def test_what_the_release_refuses_beside_enable_pdmux_is_refused_before_any_launch(tmp_path, capsys, flags, said):
    """SGLang 0.5.23 (validation_hook.py) refuses --enable-pdmux with chunked prefill (on by default),
    the overlap schedule (on by default) or pipeline parallelism: every launch would fail."""
    command = f"python -m sglang.launch_server --enable-pdmux --pdmux-config-path {{config}} --port {{port}} {flags}"
    argv = ["tune", "--launch", command, "--device", "sim:H100", "--slo-itl-ms", "30", "--log-dir", str(tmp_path / "l")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SGLang 0.5.23 refuses --enable-pdmux with" in err and said in err
    assert not (tmp_path / "l").exists()


def test_a_command_without_port_is_refused(capsys):
    assert main(["tune", "--launch", "serve --config {config}", "--slo-itl-ms", "50"]) == 2
    assert "{port}" in capsys.readouterr().err


def test_tune_launch_runs_pdtop_serve(tmp_path):
    """Real `pdtop serve` processes on a simulated H100: launched, loaded, stopped; the YAML written
    is the chosen candidate's, which pdtop's loader reads back. Its rounds are read over {control_port}:
    each candidate's ITL p99 is its rounds', not its requests' TPOT, and the report and YAML say so."""
    from pdtop.engine.scheduling.pdmux_config import load_pdmux_config

    command = (f"{sys.executable} -m pdtop serve --device sim:H100 --workload none --port {{control_port}} "
               "--config {config} --api-port {port}")
    argv = ["tune", "--launch", command, "--device", "sim:H100", "--slo-itl-ms", "40", "--json",
            "--workload", "decode_bs=4,decode_prompt=256,long_tokens=2048,long_prompts=1,decode_tokens=16",
            "--max-candidates", "2", "--log-dir", str(tmp_path / "logs"), "--out", str(tmp_path / "best.yaml"),
            "--results", str(tmp_path / "runs.jsonl")]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            rc = main(argv)
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
    assert rc == 0
    out = json.loads(buf.getvalue())
    recs = records(tmp_path)
    # cheap before expensive: the candidates with the running server's SM layout were set live over
    # pdtop's websocket (the server confirmed each in a config event); only a new layout got a new server
    live = [r for r in recs if r["live"]]
    assert out["search"]["launches"] == 2 and len(live) == out["launch"]["live"] >= 2
    assert len({r["launch"] for r in recs}) == 2 and all(r["ok"] for r in recs)
    logs = sorted((tmp_path / "logs").glob("candidate-*.log"))
    assert len(logs) == 2 and all("api on http://" in p.read_text() for p in logs)
    # the SLO held against the rounds' ITL p99 (round_reader; tests/tune/test_round_reader.py checks them
    # against the requests' own token gaps): every measurement read rounds, and a candidate's figure is
    # the mean of its measurements' rounds' p99, where its requests' TPOT p99 would be another figure
    assert out["launch"]["itl_from"] == "rounds" and "decode rounds" in out["launch"]["itl_p99_ms_is"]
    assert all(r["rounds"]["rounds"] > 0 and r["rounds"]["gaps"] > 0 for r in recs)
    checked = 0
    for c in out["candidates"]:  # those whose every measurement is of this configuration (not one alike)
        mine = [r for r in recs if all(r["config"][k] == v for k, v in c["config"].items())]
        if len(mine) == c["measured"]:
            checked += 1
            assert c["itl_p99_ms"] == pytest.approx(statistics.fmean(r["rounds"]["itl_p99_s"] for r in mine) * 1e3)
    assert checked >= 2
    tpots = [score_http(HttpRun([HttpSample.from_json(x) for x in r["samples"]], r["window_s"], []), Slo(1.0))
             for r in recs]
    assert all(m.itl_from == "tpot" for m in tpots)
    assert any(m.itl_p99_s != pytest.approx(r["rounds"]["itl_p99_s"]) for m, r in zip(tpots, recs, strict=True))
    head = (tmp_path / "best.yaml").read_text().splitlines()[:3]
    assert head[0].endswith("SLO ITL p99 (rounds) <= 40 ms") and "decode rounds" in head[2]
    best = load_pdmux_config(str(tmp_path / "best.yaml"))
    yamls = [load_pdmux_config(str(p)) for p in sorted((tmp_path / "logs").glob("candidate-*.yaml"))]
    assert len(yamls) == len(recs) and best in yamls
    assert not processes_naming(str(tmp_path))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a usable GPU")
def test_a_cuda_space_without_a_gpu_is_one_line(capsys):
    """--device cuda asks a child process for the GPU (no CUDA context of pdtop's beside the servers);
    where there is none, one line and exit 2, nothing launched."""
    assert main(["tune", "--launch", "x {port}", "--device", "cuda", "--slo-itl-ms", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pdtop tune: error: cuda device unavailable: ")


WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


def dataset(tmp: Path, rows: int = 5, name: str = "d.jsonl") -> tuple[Path, list[tuple[int, int]]]:
    """A custom JSONL written here: row i has i + 3 words and output_len i + 2 (the stand-in reports
    a prompt's words as its prompt tokens), so each request sent can be told apart."""
    path = tmp / name
    lines = [{"prompt": " ".join(WORDS[: i + 3]), "output_len": i + 2} for i in range(rows)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, [(i + 3, i + 2) for i in range(rows)]


def dataset_tune(tmp: Path, path: Path, *extra: str) -> tuple[int, dict]:
    args = ["--dataset-name", "custom", "--dataset-path", str(path), "--skip-chat-template", *extra]
    return tune_on(tmp, standin(tmp), *args)


def tune_on(tmp: Path, command: str, *extra: str) -> tuple[int, dict]:
    """`tune()` without the scenario's --workload."""
    out = tmp / "out.json"
    argv = ["tune", "--launch", command, "--device", "cpu", "--slo-itl-ms", SLO_MS, "--results",
            str(tmp / "runs.jsonl"), "--json", *extra]
    with open(out, "w") as f:
        old, sys.stdout = sys.stdout, f
        try:
            rc = main(argv)
        finally:
            sys.stdout = old
    text = out.read_text()
    return rc, json.loads(text) if text.strip() else {}


def test_dataset_traffic_sends_the_datasets_requests_to_each_candidate(tmp_path):
    path, rows = dataset(tmp_path)
    rc, out = dataset_tune(tmp_path, path, "--max-candidates", "2", "--num-prompts", str(len(rows)))
    assert rc == 0
    recs = records(tmp_path)
    assert len(recs) == 2 and all(r["ok"] for r in recs)
    for r in recs:  # every row once (the warm-up is not counted), each with its own length
        assert sorted((s["prompt_tokens"], s["output_tokens"]) for s in r["samples"]) == rows
        assert all(s["long"] for s in r["samples"])
    header = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[0])
    assert header["workload"]["dataset"] == "custom" and header["workload"]["num_prompts"] == len(rows)
    assert len(header["workload"]["sha256"]) == 64
    assert out["launch"]["dataset"] == header["workload"] and out["chosen"]["requests"] == len(rows)
    assert not [p for p in pids(tmp_path) if alive(p)]


def test_num_prompts_and_request_rate_shape_the_dataset_traffic(tmp_path):
    path, rows = dataset(tmp_path)
    dataset_tune(tmp_path, path, "--max-candidates", "1", "--num-prompts", "8", "--request-rate", "20")
    (rec,) = records(tmp_path)
    assert len(rec["samples"]) == 8  # 5 rows, topped up by seeded choice as vLLM oversamples
    assert {(s["prompt_tokens"], s["output_tokens"]) for s in rec["samples"]} <= set(rows)
    sent = sorted(s["sent_s"] for s in rec["samples"])
    assert sent[-1] > 0.1  # Poisson arrivals at 20/s: the last is sent about 8 / 20 s after the first
    assert json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[0])["request_rate"] == 20


def test_a_resume_with_another_dataset_is_refused_and_the_same_one_is_reused(tmp_path, capsys):
    path, _ = dataset(tmp_path)
    dataset_tune(tmp_path, path, "--max-candidates", "1", "--num-prompts", "5")
    _, out = dataset_tune(tmp_path, path, "--max-candidates", "1", "--num-prompts", "5")
    assert out["launch"]["reused"] == 1
    capsys.readouterr()
    path.write_text(path.read_text().replace("alpha", "omega"))  # the same name, other prompts
    assert dataset_tune(tmp_path, path, "--max-candidates", "1", "--num-prompts", "5") == (2, {})
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "another command, workload or seed" in err
    scenario = ["--workload", SMALL, "--max-candidates", "1"]  # nor does the scenario take a dataset's results
    assert tune_on(tmp_path, standin(tmp_path), *scenario) == (2, {})
    assert len(records(tmp_path)) == 2 and len(pids(tmp_path)) == 2


@pytest.mark.parametrize(("extra", "line"), [
    (["--dataset-name", "custom", "--dataset-path", "{tmp}/missing.jsonl"], "missing.jsonl: No such file"),
    (["--dataset-name", "custom", "--dataset-path", "{tmp}/bad.jsonl"], "bad.jsonl:1: not a JSON object"),
    (["--dataset-path", "{tmp}/bad.jsonl"], "--dataset-path needs --dataset-name sharegpt or custom"),
    (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path FILE"),
    (["--num-prompts", "5"], "--num-prompts counts --dataset-path's requests"),
    (["--dataset-name", "custom", "--dataset-path", "{tmp}/bad.jsonl", "--num-prompts", "0"],
     "--num-prompts must be >= 1, got 0"),
    (["--tokenizer", "{tmp}/bad.jsonl"], "bad.jsonl"),
    (["--dataset-name", "custom", "--dataset-path", "/dev/zero"], "/dev/zero: not a regular file"),  # never ends
])
def test_bad_dataset_options_are_one_line_and_launch_nothing(tmp_path, capsys, extra, line):
    (tmp_path / "bad.jsonl").write_text("not json\n")
    extra = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    rc, out = tune_on(tmp_path, standin(tmp_path), *extra)
    err = capsys.readouterr().err
    assert (rc, out) == (2, {}) and err.count("\n") == 1 and line in err, err
    assert not pids(tmp_path) and not (tmp_path / "runs.jsonl").exists()


def test_another_tokenizer_is_another_workload(tmp_path, capsys):
    """--tokenizer (the launched model's) cuts the prompts: its name is in the results' workload, so a
    resume with SGLang's default tokenizer instead does not mix the two."""
    from pdtop.engine.model.loader import default_model_path

    other = tmp_path / "their-model.gguf"
    other.symlink_to(default_model_path())
    path, _ = dataset(tmp_path)
    assert dataset_tune(tmp_path, path, "--max-candidates", "1", "--tokenizer", str(other))[0] == 0
    header = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[0])
    assert header["workload"]["tokenizer"] == "their-model.gguf"
    capsys.readouterr()
    assert dataset_tune(tmp_path, path, "--max-candidates", "1") == (2, {})
    assert "another command, workload or seed" in capsys.readouterr().err


def test_dataset_options_without_launch_are_refused(capsys):
    assert main(["tune", "--slo-itl-ms", "10", "--dataset-name", "custom", "--dataset-path", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--launch's traffic" in err


def test_dataset_traffic_through_pdtop_serve(tmp_path, monkeypatch):
    """A custom JSONL's requests through real `pdtop serve` processes on a simulated H100: every
    request streams its own output_len (ignore_eos), prompt tokens as the server counts them."""
    path, rows = dataset(tmp_path, rows=4)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    command = (f"{sys.executable} -m pdtop serve --device sim:H100 --workload none --port 0 "
               "--config {config} --api-port {port}")
    rc, out = tune_on(tmp_path, command, "--dataset-name", "custom", "--dataset-path", str(path), "--num-prompts", "4",
                      "--request-rate", "50", "--max-candidates", "2", "--device", "sim:H100")
    assert rc == 0, out
    for r in records(tmp_path):
        assert r["ok"] and sorted(s["output_tokens"] for s in r["samples"]) == [o for _, o in rows]
        assert all(s["prompt_tokens"] > 0 for s in r["samples"])  # the chat template's, from the server's usage
    assert not processes_naming(str(tmp_path))


def test_a_control_port_that_is_no_pdtop_protocol_falls_back_to_tpot_and_says_why(tmp_path, capsys):
    """{control_port} named, but what listens there answers HTTP 404 to a websocket: no live changes, no
    rounds, and the candidate is measured all the same, on TPOT, with the reason said once."""
    command = standin(tmp_path, "--not-ws-port", "{control_port}")
    argv = ["tune", "--launch", command, "--device", "cpu", "--slo-itl-ms", SLO_MS, "--workload", SMALL,
            "--max-candidates", "1", "--results", str(tmp_path / "runs.jsonl")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    err = [x for x in captured.err.splitlines() if "stands in" in x]
    assert len(err) == 1 and err[0].startswith("pdtop tune: TPOT p99 stands in for ITL p99: no round read: no "
                                               "pdtop protocol on control port ")
    assert "404" in err[0]
    recs = records(tmp_path)
    assert recs and all(r["ok"] and r["no_rounds"] == err[0].split("ITL p99: ", 1)[1] for r in recs)
    assert [x for x in captured.out.splitlines() if x.startswith("ITL column: each request's TPOT p99; no round")]
