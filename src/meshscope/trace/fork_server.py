"""A fake world's ranks forked from one process that imported torch once.

Each rank class of a fake world is one process, and a fresh process pays Python and torch's import
(1.2 s on a 2-core EPYC), FakeTensorMode's Dynamo (1.7 s) and the script's own library imports
(torch's test models: 1.4 s) before the script's first line: at 9 to 27 classes, most of the wall
time. So `meshscope trace --fake-world` starts one server (``python -m meshscope.trace.fork_server``)
that imports torch, its parallel APIs and meshscope's rank program once and forks every rank from
that state (`trace.rank.main` runs in the child, as it would in a fresh process). Each forked rank
also writes the library modules its script imported (`_write_imports`); the server imports them
before it forks the next rank, so later ranks skip the script's imports too. Should such an import
start a thread (which a forked child would lack), the server stops taking what ranks import and
says so; the ranks stay correct, only slower.

Protocol, one JSON object per line: the caller writes ``{"run": [ranks], "parallel": P}`` on the
server's stdin and reads ``{"done": rank, "code": exit code}`` for each rank, P at a time; a forked
rank's environment is `fake.environment` of its rank, its output goes to ``logs/rank<R>.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

PRELOAD = ("torch", "torch.distributed", "torch.distributed.device_mesh", "torch.distributed.tensor",
           "torch.distributed.tensor.parallel", "torch.distributed.fsdp", "torch.distributed.pipelining",
           "torch.nn.parallel", "torch.testing._internal.distributed.fake_pg", "meshscope.trace.rank")
"""What every rank imports before its script: torch's parallel APIs and the rank program."""

IMPORTS = "imports"
"""Folder of the run directory where forked ranks list the library modules their script imported."""


class ForkServer:
    """The caller's side: start the server, run ranks through it, stop it."""

    def __init__(self, run_dir: Path, program: list[str], world: int, per_node: int, fake_tensors: bool):
        self.run_dir = run_dir
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # no thread pool before a fork
        args = [sys.executable, "-m", "meshscope.trace.fork_server", str(run_dir), str(world), str(per_node),
                *(["--fake-tensors"] if fake_tensors else []), "--", *program]
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._log = open(run_dir / "logs" / "fork_server.log", "w")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=env)

    def run(self, ranks: list[int], parallel: int) -> dict[int, int]:
        """Exit code per rank, `parallel` ranks at a time."""
        if not ranks:
            return {}
        self.proc.stdin.write(json.dumps({"run": ranks, "parallel": parallel}) + "\n")
        self.proc.stdin.flush()
        codes: dict[int, int] = {}
        while len(codes) < len(ranks):
            line = self.proc.stdout.readline()
            if not line:  # the server died: what it did not run failed
                return {**{r: 1 for r in ranks}, **codes}
            reply = json.loads(line)
            codes[reply["done"]] = reply["code"]
        return codes

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self._log.close()


LIBRARY_ROOTS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
"""Where the standard library and installed packages live: only their modules are imported ahead."""


def _library_module(module) -> bool:
    """A module of the standard library or of an installed package (not the script's own folder)."""
    return (getattr(module, "__file__", None) or "").startswith(LIBRARY_ROOTS)


def _write_imports(run_dir: Path, rank: int, before: set[str]):
    """The `rank.main` ``on_end`` of a forked rank: list the library modules its script imported."""
    def on_end() -> None:
        names = [name for name, module in list(sys.modules.items())
                 if name not in before and name != "__main__" and module is not None and _library_module(module)]
        (run_dir / IMPORTS).mkdir(exist_ok=True)
        (run_dir / IMPORTS / f"rank{rank}.json").write_text(json.dumps(names))
    return on_end


class _Server:
    def __init__(self, run_dir: Path, world: int, per_node: int, fake_tensors: bool, program: list[str]):
        self.run_dir, self.world, self.per_node, self.program = run_dir, world, per_node, program
        self.learning = True
        self.learned: set[Path] = set()
        for name in PRELOAD:
            __import__(name)
        if fake_tensors:
            __import__("torch._subclasses.fake_tensor")
            __import__("torch._dynamo")  # what FakeTensorMode's first use imports

    def _learn(self) -> None:
        """Import what finished ranks' scripts imported, unless that would start a thread."""
        if not self.learning:
            return
        for path in sorted((self.run_dir / IMPORTS).glob("rank*.json")):
            if path in self.learned:
                continue
            self.learned.add(path)
            for name in json.loads(path.read_text()):
                try:
                    __import__(name)
                except Exception:  # noqa: BLE001 - a module the rank imported in its own way: it will again
                    continue
            if threading.active_count() > 1:
                self.learning = False
                print("fork server: a module the script imports started a thread; later ranks import it "
                      "themselves", file=sys.stderr, flush=True)
                return

    def run(self, ranks: list[int], parallel: int) -> None:
        pending, alive = list(ranks), {}
        while pending or alive:
            while pending and len(alive) < max(1, parallel):
                self._learn()
                rank = pending.pop(0)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    self._child(rank)  # never returns
                alive[pid] = rank
            pid, status = os.wait()
            rank = alive.pop(pid)
            print(json.dumps({"done": rank, "code": os.waitstatus_to_exitcode(status)}), flush=True)

    def _child(self, rank: int) -> None:
        code = 1
        try:
            import random

            from . import fake, rank as rank_program

            random.seed()  # as a fresh interpreter would
            os.environ.update(fake.environment(rank, self.world, self.per_node))
            log = os.open(self.run_dir / "logs" / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for fd in (1, 2):
                os.dup2(log, fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            sys.stdin = open(os.devnull)
            before = set(sys.modules)
            code = rank_program.main(self.program, on_end=_write_imports(self.run_dir, rank, before))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported in the rank's log, as a fresh process would
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def main(argv: list[str]) -> int:
    cut = argv.index("--")
    run_dir, world, per_node = Path(argv[0]), int(argv[1]), int(argv[2])
    server = _Server(run_dir, world, per_node, "--fake-tensors" in argv[3:cut], argv[cut + 1:])
    for line in sys.stdin:
        request = json.loads(line)
        server.run(request["run"], request["parallel"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
