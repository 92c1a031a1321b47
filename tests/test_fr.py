"""The doctor on PyTorch Flight Recorder dumps: real gloo fixtures (tests/fixtures/flight_recorder/),
every format version derived from them field by field, and bad input refused in one line."""

from __future__ import annotations

import copy
import os
import pickle
import shutil

import pytest

from meshscope.core.errors import UsageError
from meshscope.doctor import diagnose
from meshscope.doctor.fr_records import VERSIONS, parse
from meshscope.trace import fr_dump

from .helpers import ROOT, cli_here
from .test_doctor import call, write_run

FIXTURES = ROOT / "tests" / "fixtures" / "flight_recorder"


def _docs(case: str) -> dict[int, dict]:
    return {r: pickle.loads((FIXTURES / case / f"rank_{r}").read_bytes()) for r in range(4)}


def _write(tmp_path, docs: dict[int, dict], prefix: str = "rank_"):
    for r, doc in docs.items():
        (tmp_path / f"{prefix}{r}").write_bytes(pickle.dumps(doc))
    return tmp_path


def _kinds(report) -> list[tuple]:
    doc = report if isinstance(report, dict) else report.to_json()
    return [(f["kind"], f["axis"], f["group"], f["ranks"], f["evidence"]) for f in doc["findings"]]


def test_a_rank_that_skipped_a_collective_is_named_with_its_last_entry():
    report = diagnose(FIXTURES / "missing").to_json()
    assert _kinds(report)[0] == ("missing", "world", [0, 1, 2, 3], [1], "flight recorder")
    f = report["findings"][0]
    assert f["entry"] == "collective #3 of world[0, 1, 2, 3]: all_reduce other 16 B"
    assert "rank 1 last issued all_reduce other 16 B on tp" in f["cause"]
    assert report["sources"]["flight_recorder"] == {"source": str(FIXTURES / "missing"), "version": "2.10",
                                                    "backend": "gloo", "ranks": [0, 1, 2, 3]}


def test_json_is_preferred_and_reads_as_the_pickle(tmp_path):
    for r in range(4):
        shutil.copy(FIXTURES / "missing" / f"rank_{r}", tmp_path)
    from_pickle, from_json = diagnose(tmp_path).to_json(), diagnose(FIXTURES / "missing").to_json()
    assert _kinds(from_pickle) == _kinds(from_json)
    assert [f["entry"] for f in from_pickle["findings"]] == [f["entry"] for f in from_json["findings"]]


def test_a_different_collective_at_the_same_position_is_a_mismatch():
    [f] = diagnose(FIXTURES / "mismatch").to_json()["findings"]
    assert (f["kind"], f["axis"], f["group"], f["ranks"]) == ("mismatch", "tp", [0, 1], [0, 1])
    assert "rank 0 all_reduce other 16 B; rank 1 broadcast other 16 B" in f["entry"]


def test_a_prefix_picks_one_job_among_others(tmp_path):
    _write(tmp_path, _docs("missing"), "nccl_trace_rank_")
    _write(tmp_path, _docs("mismatch"), "other_job_")
    assert _kinds(diagnose(tmp_path / "nccl_trace_rank_"))[0][:2] == ("missing", "world")
    with pytest.raises(UsageError, match="several prefixes"):
        diagnose(tmp_path)


def _as_version(doc: dict, version: str) -> dict:
    """A 2.10 dump as `version` writes it (fr_records' table): later fields removed, renamed ones renamed."""
    doc = copy.deepcopy(doc)
    doc["version"] = version
    minor = int(version.split(".")[1])
    if minor < 10:
        for e in doc["entries"]:
            e.pop("thread_name"), e.pop("thread_id")
        lib = doc.pop("comm_lib_version")
        if minor >= 5:
            doc["nccl_version"] = lib
    if minor < 3:
        doc.pop("pg_status")
    if minor < 4:
        for e in doc["entries"]:
            if e["profiling_name"].endswith("all_to_all"):
                e["input_sizes"] = e["output_sizes"] = []
    return doc


@pytest.mark.parametrize("version", VERSIONS)
def test_every_known_version_reads_to_the_same_finding(tmp_path, version):
    docs = {r: _as_version(d, version) for r, d in _docs("missing").items()}
    report = diagnose(_write(tmp_path, docs)).to_json()
    assert _kinds(report)[0] == ("missing", "world", [0, 1, 2, 3], [1], "flight recorder")
    assert report["sources"]["flight_recorder"]["version"] == version


@pytest.mark.parametrize("version", ["1.5", "2.1", "2.11", "3.0"])
def test_an_unknown_version_is_refused_naming_it(tmp_path, version):
    docs = _docs("missing")
    docs[2]["version"] = version
    with pytest.raises(UsageError) as exc:
        diagnose(_write(tmp_path, docs))
    assert f"format version '{version}' is not one meshscope reads (known: 2.2, 2.3" in str(exc.value)


def test_a_pickle_that_would_run_code_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Payload()]}))
    with pytest.raises(UsageError, match=r"refused global (posix|os)\.system"):
        diagnose(tmp_path / "dumps")
    proc = cli_here("doctor", tmp_path / "dumps")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize("content, message", [
    (lambda: (FIXTURES / "missing" / "rank_0").read_bytes()[:700], "not a readable Flight Recorder dump (pickle"),
    (lambda: pickle.dumps([1, 2, 3]), "not a Flight Recorder dump: expected a dict"),
    (lambda: b"garbage bytes", "not a readable Flight Recorder dump"),
], ids=["truncated", "foreign", "garbage"])
def test_bad_dumps_are_one_line_errors_with_exit_2(tmp_path, content, message):
    docs = _write(tmp_path, _docs("missing"))
    (docs / "rank_3").write_bytes(content())
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        diagnose(tmp_path)
    proc = cli_here("doctor", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "rank_3" in proc.stderr


def test_nothing_to_read_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "empty" / "nccl_trace_rank_"):
        proc = cli_here("doctor", target)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Flight Recorder dump" in proc.stderr and "Traceback" not in proc.stderr


def _nccl(rank: int, entries: list[dict], world=(0, 1), extra_groups=None) -> dict:
    """A dump as NCCL writes it (format 2.10): pg_config lists each group's ranks."""
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(world))}} | (extra_groups or {})
    return {"version": "2.10", "comm_lib_version": "2.28.3", "pg_config": groups, "pg_status": {}, "entries": entries}


def _entry(i, name, seq, state="completed", group=("0", "default_pg"), p2p=0, size=(4,)):
    return {"record_id": i, "pg_id": int(group[0]), "process_group": group, "collective_seq_id": seq if not p2p else 0,
            "p2p_seq_id": p2p, "op_id": i + 1, "profiling_name": name, "time_created_ns": 10**18 + i,
            "input_sizes": [list(size)], "input_dtypes": ["Float"], "output_sizes": [list(size)],
            "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000,
            "is_p2p": bool(p2p)}


def test_mixed_jobs_are_refused(tmp_path):
    docs = {0: _nccl(0, [_entry(0, "nccl:all_reduce", 1)]), 1: _nccl(1, [_entry(0, "nccl:all_reduce", 1)], (0, 1, 2, 3))}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    with pytest.raises(UsageError, match=r"different jobs are mixed: their world .* differs"):
        diagnose(_write(tmp_path / "a", docs))
    docs = _docs("missing")
    docs[1] = _as_version(docs[1], "2.7")
    with pytest.raises(UsageError, match="format version differs"):
        diagnose(_write(tmp_path / "b", docs))


def test_nccl_send_without_recv(tmp_path):
    docs = {0: _nccl(0, [_entry(0, "nccl:all_reduce", 1), _entry(1, "nccl:send 0->1", 0, "started", p2p=1)]),
            1: _nccl(1, [_entry(0, "nccl:all_reduce", 1)])}
    [f] = diagnose(_write(tmp_path, docs)).to_json()["findings"]
    assert (f["kind"], f["axis"], f["ranks"]) == ("p2p", "world", [0, 1])
    assert "rank 0 issued send other 16 B; rank 1 never posted the recv" in f["entry"]


def test_every_rank_stuck_in_the_same_collective(tmp_path):
    docs = {r: _nccl(r, [_entry(0, "nccl:all_reduce", 1), _entry(1, "nccl:all_gather", 2, "started")]) for r in (0, 1)}
    [f] = diagnose(_write(tmp_path, docs)).to_json()["findings"]
    assert (f["kind"], f["axis"], f["ranks"]) == ("stuck", "world", [0, 1])
    assert f["entry"].startswith("collective #1 of world[0, 1]: all_gather") and "none finished" in f["cause"]


def test_groups_created_in_different_orders(tmp_path):
    docs = _docs("mismatch")
    for e in docs[1]["entries"]:
        if e["process_group"][0] == "1":
            e["process_group"] = ("1", "mesh_dp")
    [f] = diagnose(_write(tmp_path, docs)).to_json()["findings"]
    assert (f["kind"], f["ranks"]) == ("group-order", [1]) and "rank 1 has mesh_dp" in f["entry"]


def test_group_membership_that_differs(tmp_path):
    def tp(ranks):
        return {"1": {"name": "1", "desc": "mesh_tp", "ranks": str(ranks)}}

    docs = {0: _nccl(0, [_entry(0, "nccl:all_reduce", 1, group=("1", "mesh_tp"))], extra_groups=tp([0, 1])),
            1: _nccl(1, [_entry(0, "nccl:all_reduce", 1, group=("1", "mesh_tp"))], extra_groups=tp([1]))}
    [f] = diagnose(_write(tmp_path, docs)).to_json()["findings"]
    assert (f["kind"], f["axis"], f["ranks"]) == ("group-membership", "tp", [1])


def test_a_trace_directory_with_both_sources_says_what_each_finding_rests_on(tmp_path):
    world = {"axis": "world", "group": (0, 1, 2, 3)}
    logs = {r: call(r, "all_reduce", t=1e9, **world) + ([] if r == 1 else call(r, "all_reduce", t=2e9, seq=1, done=False, **world))
            for r in range(4)}
    run = write_run(tmp_path, logs)
    (run / "fr").mkdir()
    for r in range(4):
        shutil.copy(FIXTURES / "missing" / f"rank_{r}.json", run / "fr")
    report = diagnose(run).to_json()
    assert report["sources"]["flight_log"] and report["sources"]["flight_recorder"]["backend"] == "gloo"
    assert [(f["kind"], f["axis"], f["evidence"]) for f in report["findings"]] == [("missing", "world", "both")]


@pytest.mark.parametrize("form", ["pickle/rank_", "json"])
def test_a_real_nccl_dump_reads_with_its_groups_axes_and_states(form):
    """One H200, torch 2.11, NCCL world 1 (tests/fixtures/flight_recorder/make_nccl.py): the pickle holds
    no global at all, like gloo's, and torch's own analyzer (run there) found nothing either."""
    from meshscope.doctor.fr_job import load_job

    job = load_job(FIXTURES / "nccl_world1" / form)
    assert (job.version, job.backend) == ("2.10", "nccl")
    dump = job.dumps[0]
    assert {g.desc: g.ranks for g in dump.groups.values()} == {"default_pg": (0,), "TENSOR_MODEL_PARALLEL_GROUP": (0,)}
    calls = [(e.event.op, e.event.axis, e.event.dtype, e.state) for e in dump.entries]
    assert calls == [("all_reduce", "world", "float32", "completed"), ("all_gather", "world", "float32", "completed"),
                     ("reduce_scatter", "world", "float32", "completed"), ("all_to_all", "world", "float32", "completed"),
                     ("broadcast", "tp", "bfloat16", "completed")]
    assert diagnose(FIXTURES / "nccl_world1" / form).to_json()["healthy"]


def test_torchs_analyzer_finds_no_more_than_the_doctor_in_the_nccl_dump():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                           str(FIXTURES / "nccl_world1" / "pickle"), "-p", "rank_"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    findings = [ln for ln in proc.stdout.splitlines() if ln.strip() and "tabulate" not in ln]
    assert findings == []  # torchfrtrace reports nothing; so does the doctor (above), which names each call's axis too


def test_nccl_entries_give_the_traced_calls_their_gpu_times():
    """Per group, the k-th traced collective is the entry with collective_seq_id k and the k-th send or
    recv the one with p2p_seq_id k; an entry whose op differs (a coalesced batch) or that has no duration
    (still running) gives none, and a gloo dump none at all."""
    timed = [dict(_entry(0, "nccl:all_reduce", 1), duration_ms=0.5), dict(_entry(1, "nccl:send 0->1", 0, p2p=1),
             duration_ms=0.25), dict(_entry(2, "nccl:all_reduce", 2), duration_ms=0.75),
             dict(_entry(3, "nccl:all_gather", 3), duration_ms=9.0), _entry(4, "nccl:all_reduce", 4, state="started")]
    dump = parse(0, _nccl(0, timed), "rank 0", {})
    calls = [("0", "all_reduce"), ("0", "send"), ("0", "all_reduce"), ("0", "all_reduce"), ("0", "all_reduce")]
    assert fr_dump.matched(calls, dump) == {0: 0.5, 1: 0.25, 2: 0.75}
    gloo = parse(0, _nccl(0, [dict(_entry(0, "gloo:all_reduce", 1), duration_ms=0.5)]), "rank 0", {})
    assert fr_dump.matched(calls[:1], gloo) == {}
