"""Sweeps: ``analyze_many`` on a LocalCluster over a few tiny real training runs (two healthy learning rates,
two that diverge), the table against ``analyze`` of each run, a scheduler address used unchanged, error rows,
hyperparameters stored by the recorder, the missing-dependency error and ``comgra-ndbg sweep``."""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:  # the sweep extra; without it the tests that need it skip themselves, the others still run
    import pandas as pd
    from distributed import Client, LocalCluster
except ImportError:
    pd = Client = LocalCluster = None

from benchmarks.sweep import record_tiny_run
from comgra_ndbg import Recorder, cli, open_recording
from comgra_ndbg.analysis import analyze
from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError, RecordingNotFoundError
from comgra_ndbg.sweep import SWEEP_COLUMNS, analyze_many, expand
from comgra_ndbg.sweep.table import filter_rows, parse_filter, sort_rows

RATES = {"slow": 0.01, "good": 0.05, "hot": 2.0, "wild": 20.0}
requires_extra = pytest.mark.skipif(pd is None or Client is None,
                                    reason="needs the sweep extra (pip install 'comgra-ndbg[sweep]')")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sweep") / "runs"
    for trial, lr in RATES.items():
        record_tiny_run(folder, trial, lr=lr, steps=40, seed=1)
    return folder


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                      silence_logs=40) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as connected:
        yield connected


@requires_extra
def test_the_table_holds_each_trials_diagnosis_loss_and_hyperparameters(sweep: Path, client: Client) -> None:
    frame = analyze_many(str(sweep / "*"), client=client, store=False)
    assert list(frame.columns) == list(SWEEP_COLUMNS) + ["lr", "seed"]
    assert frame["trial"].tolist() == sorted(RATES)  # one row per trial, in path order
    assert len(client.scheduler_info()["workers"]) == 2
    for row in frame.itertuples(index=False):
        diagnosis = analyze(sweep / row.trial, store=False)
        top = diagnosis.top
        assert row.lr == RATES[row.trial] and row.seed == 1 and row.steps == 40 and row.error == ""
        if top is None:
            assert (row.type, row.hypothesis, row.node) == ("healthy", "", "") and pd.isna(row.onset)
        else:
            assert (row.type, row.origin, row.node, row.onset, row.hypothesis) == (
                top.type, top.origin, top.node, top.onset, top.sentence)
            assert row.confidence == pytest.approx(top.confidence)
        with open_recording(sweep / row.trial) as recording:
            last = float(recording.kpi("loss")[1][-1])
        assert (math.isnan(last) and math.isnan(row.final_loss)) or row.final_loss == last
    types = dict(zip(frame["trial"], frame["type"]))
    assert types["good"] == "healthy" and types["wild"] != "healthy"  # the sweep has both kinds to show


@requires_extra
def test_a_scheduler_address_runs_the_same_code(sweep: Path, cluster: LocalCluster, client: Client) -> None:
    by_address = analyze_many([sweep], scheduler=cluster.scheduler_address, store=False)
    by_client = analyze_many([sweep], client=client, store=False)
    pd.testing.assert_frame_equal(by_address, by_client)
    assert by_address["path"].tolist() == [str(sweep)] * len(RATES)  # a group folder: one row per trial inside
    with pytest.raises(InvalidArgumentError, match="either client or scheduler"):
        analyze_many(sweep, client=client, scheduler=cluster.scheduler_address)


@requires_extra
def test_without_client_or_scheduler_a_local_cluster_of_processes_runs_and_is_closed(
        sweep: Path, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    import distributed

    made, kinds = [], []

    def spy(*args, **kwargs) -> LocalCluster:
        made.append(LocalCluster(*args, **kwargs))
        kinds.append(sorted({type(w).__name__ for w in made[-1].workers.values()}))
        return made[-1]

    monkeypatch.setattr(distributed, "LocalCluster", spy)
    table = analyze_many(str(sweep / "*"), workers=1, store=False)  # neither client nor scheduler
    assert kinds == [["Nanny"]]  # one cluster, its one worker a separate process
    assert made[0].status.name == "closed"
    pd.testing.assert_frame_equal(table, analyze_many(str(sweep / "*"), client=client, store=False))


@requires_extra
def test_an_unreadable_trial_is_an_error_row_and_the_rest_is_analysed(sweep: Path, tmp_path: Path,
                                                                      client: Client) -> None:
    broken = tmp_path / "runs"
    record_tiny_run(broken, "fine", lr=0.05, steps=30)
    record_tiny_run(broken, "torn", lr=0.05, steps=30)
    (broken / "torn" / "recording.h5").write_bytes(b"not an HDF5 file at all")
    frame = analyze_many(str(broken / "*"), client=client, store=False)
    rows = frame.set_index("trial")
    assert rows.loc["fine", "error"] == "" and rows.loc["fine", "type"] == "healthy"
    assert rows.loc["torn", "error"].startswith("CorruptRecordingError: the recording at ")
    assert "comgra-ndbg check" in rows.loc["torn", "error"] and rows.loc["torn", "type"] == ""
    assert rows.loc["torn", "steps"] == 0 and pd.isna(rows.loc["torn", "final_loss"])


def test_expand_lists_each_trial_once_and_refuses_what_holds_nothing(sweep: Path, tmp_path: Path) -> None:
    (sweep.parent / "notes.txt").write_text("not a recording")
    assert expand([str(sweep / "*"), str(sweep), str(sweep.parent / "*.txt")]) == [
        (str(sweep / t), t) for t in sorted(RATES)]  # the group folder names the same trials again
    with pytest.raises(RecordingNotFoundError):
        expand(tmp_path / "nowhere")
    with pytest.raises(InvalidArgumentError, match=r"no recording found at .*\(quote it so the shell leaves it alone\)"):
        expand(str(tmp_path / "nothing-*"))


@requires_extra
def test_stored_analyses_are_reused_and_written(sweep: Path, client: Client, tmp_path: Path) -> None:
    fresh = tmp_path / "runs"
    record_tiny_run(fresh, "one", lr=20.0, steps=40)
    with open_recording(fresh) as recording:
        assert recording.analysis() is None
    analyze_many(fresh, client=client)  # store=True: what is missing is analysed and stored beside the run
    with open_recording(fresh) as recording:
        stored = recording.analysis()
        assert stored is not None and not stored.stale and stored.num_steps == 40


def test_the_recorder_stores_hyperparameters_flat_and_refuses_what_a_table_cannot_hold(tmp_path: Path) -> None:
    with Recorder(tmp_path, "t", hyperparameters={"lr": 0.1, "optimizer": {"name": "adam", "beta1": 0.9}}) as rec:
        rec.add_note("nothing but the hyperparameters")
    with open_recording(tmp_path) as recording:
        assert recording.hyperparameters == {"lr": 0.1, "optimizer.name": "adam", "optimizer.beta1": 0.9}
        assert recording.config["num_samples"] == 8 and recording.config["hyperparameters"]["lr"] == 0.1
    with pytest.raises(InvalidArgumentError, match="hyperparameter 'layers' is a list; use a number, str"):
        Recorder(tmp_path, "u", hyperparameters={"layers": [1, 2]})
    with pytest.raises(InvalidArgumentError, match="hyperparameters must be a dict of names to values"):
        Recorder(tmp_path, "v", hyperparameters=[("lr", 0.1)])


def test_rows_sort_and_filter_as_the_gui_does() -> None:
    rows = [{"trial": "a", "type": "healthy", "lr": 0.01, "final_loss": 0.4},
            {"trial": "b", "type": "exploding", "lr": 2.0, "final_loss": float("nan")},
            {"trial": "c", "type": "vanishing", "lr": 0.5, "final_loss": 0.9},
            {"trial": "d", "type": "", "lr": None, "final_loss": 0.1}]
    assert [r["trial"] for r in sort_rows(rows, "lr")] == ["a", "c", "b", "d"]
    assert [r["trial"] for r in sort_rows(rows, "lr", descending=True)] == ["b", "c", "a", "d"]
    assert [r["trial"] for r in sort_rows(rows, "type")] == ["b", "a", "c", "d"]
    assert [r["trial"] for r in sort_rows(rows, "final_loss")] == ["d", "a", "c", "b"]
    assert [r["trial"] for r in filter_rows(rows, parse_filter("type!=healthy, lr>=0.5"))] == ["b", "c"]
    assert [r["trial"] for r in filter_rows(rows, parse_filter("type~ING"))] == ["b", "c"]
    assert [r["trial"] for r in filter_rows(rows, parse_filter("lr<1"))] == ["a", "c"]  # None is never < 1
    with pytest.raises(InvalidArgumentError, match="unknown column 'rate' in the filter; columns are trial, type"):
        parse_filter("rate>1", ["trial", "type"])
    with pytest.raises(InvalidArgumentError, match="cannot read the filter term 'lr'"):
        parse_filter("lr")


@requires_extra
def test_a_missing_package_is_a_typed_error_with_the_install_line(sweep: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if dask.distributed were not installed
    with pytest.raises(MissingDependencyError, match=r"needs the package 'distributed'.*comgra-ndbg\[sweep\]"):
        analyze_many(sweep)
    assert issubclass(MissingDependencyError, ImportError)


@requires_extra
def test_the_cli_prints_the_table_and_writes_csv(sweep: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.csv"
    code = cli.main(["sweep", str(sweep / "*"), "--threads", "--workers", "1", "--csv", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    lines = captured.out.splitlines()
    assert lines[0].split() == ["path", "trial", "type", "origin", "node", "onset", "confidence", "final_loss",
                                "steps", "error", "lr", "seed"]
    assert len(lines) == 1 + len(RATES) + 1 and lines[-1] == f"{len(RATES)} trials written to {out}"
    assert "analysing: 100%" in captured.err  # the progress bar
    table = pd.read_csv(out, keep_default_na=False)
    assert table["trial"].tolist() == sorted(RATES) and table["lr"].tolist() == [RATES[t] for t in sorted(RATES)]
    code = cli.main(["sweep", str(tmp_path / "none-*"), "--threads"])
    assert code == 2 and "comgra-ndbg sweep: no recording found" in capsys.readouterr().err


@pytest.fixture
def scheduler_process(tmp_path: Path) -> Iterator[str]:
    """A ``dask scheduler`` and one ``dask worker`` started as separate processes, the way a real cluster is
    (TCP, not the in-process transport of a LocalCluster without processes); yields the scheduler's address."""
    import json
    import subprocess
    import time

    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip("the dask command line is not installed next to this Python")
    file = tmp_path / "scheduler.json"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    started = [subprocess.Popen([str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", str(file)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 120
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(file.read_text())["address"]
        started.append(subprocess.Popen([str(dask), "worker", address, "--nthreads", "1", "--nworkers", "1",
                                         "--no-dashboard", "--death-timeout", "60"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address, timeout=120) as waiting:
            waiting.wait_for_workers(1, timeout=120)
        yield address
    finally:
        for process in reversed(started):
            process.terminate()
            process.wait(timeout=60)


@requires_extra
@pytest.mark.slow  # a scheduler and a worker process of their own
def test_the_cli_runs_on_a_scheduler_of_other_processes(sweep: Path, scheduler_process: str, client: Client,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler_process.startswith("tcp://127.0.0.1:")
    with Client(scheduler_process) as remote:
        worker_pids = set(remote.run(lambda: __import__("os").getpid()).values())
    assert len(worker_pids) == 1 and os.getpid() not in worker_pids  # the analysis cannot run in this process
    out = tmp_path / "remote.csv"
    code = cli.main(["sweep", str(sweep / "*"), "--scheduler", scheduler_process, "--csv", str(out)])
    captured = capsys.readouterr()
    assert code == 0 and "analysing: 100%" in captured.err and f"{len(RATES)} trials written" in captured.out
    remote_table = pd.read_csv(out, keep_default_na=False)
    local_table = analyze_many(str(sweep / "*"), client=client, store=False)
    assert remote_table["trial"].tolist() == local_table["trial"].tolist()
    assert remote_table["type"].tolist() == local_table["type"].tolist()
    assert [str(v) for v in remote_table["onset"]] == ["" if pd.isna(v) else str(v) for v in local_table["onset"]]


def test_the_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["sweep", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--scheduler ADDR" in out and "--workers N" in out and "--csv OUT" in out and "Needs the sweep extra" in out
