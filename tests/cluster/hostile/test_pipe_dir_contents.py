"""An MPS job fills and deepens its own pipe dir; the node is not drained and nothing is left (issue 31 class 1).

An ordinary ``mps:25`` job of alice's on the small lab's MPS node writes into its pipe dir (hers once the daemon
is up) what a hostile tenant can: a tree 1,500 directories deep (a path far beyond PATH_MAX, deeper than
Python's recursion limit), 2,000 files, a FIFO, a socket, links to root's files, names that are not UTF-8 or hold
a newline, directories made unreadable and unwritable, then files until no inode is left and data until no block
is left; a second job of hers keeps a file open inside it. What fills is her daemon's own tmpfs
(node.mps.PIPE_TMPFS): while it is full, carol's MPS job on the same node and GPU starts its daemon and
completes. When alice's job ends its epilog must succeed (the job COMPLETED, its journal gone, no node drained),
the health check must run clean twice (no problem, no drain, exit 0) and nothing of the key may be left under
``<state_dir>/mps``; root's files the links point to are untouched. The test node mounts a size-capped tmpfs on
``<state_dir>/mps`` (testcluster/compose.py) and each daemon's key dir is a tmpfs of its own within it: the
job's fill ends there, never in the filesystem of the journals or another user's daemon's. Before the fix the
epilog's removal of the tree failed and drained the node, and every health run failed on the same tree.

Its own compose project (small-lab with the node hooks and the health check, as tests/cluster/test_node_health.py).
Run: GPUSHARE_TEST_PROJECT=gpusharetest-cls1 .venv/bin/python -m pytest -n 0 \
    tests/cluster/hostile/test_pipe_dir_contents.py
"""

from __future__ import annotations

import os

import pytest

from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.test_node_health import PROGRAM, health_policy
from tests.cluster.test_node_runtime import (
    STATE,
    env_of,
    finished,
    journals,
    mps_daemons,
    node_shell,
    submit,
    wait_clean,
)

PROJECT = os.environ.get("GPUSHARE_TEST_PROJECT", "gpsh31") + "-pipedir"
NODE = "lab-mps01"
HELD = f"/shared/pipe-dir-held-{os.getpid()}"
FULL_MARK = f"/shared/pipe-dir-full-{os.getpid()}"  # alice's pipe dir is full: carol's MPS job comes now

# another tenant's MPS job on the same node and GPU while alice's pipe dir is full: its daemon starts in a tmpfs
# of its own, and the job sees its pipe dir
NEIGHBOUR = """test -S "$CUDA_MPS_PIPE_DIRECTORY/control" && echo NEIGHBOUR_DAEMON=1
df -P "$CUDA_MPS_PIPE_DIRECTORY" | tail -1 | awk '{print "NEIGHBOUR_FS=" $6}'
"""

FILL = f"""set -u
p=$CUDA_MPS_PIPE_DIRECTORY
echo "PIPE=$p"
cd "$p" || exit 1
mkdir -p junk && cd junk
mkfifo fifo && echo FIFO=1
python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.bind("sock")' && echo SOCKET=1
ln -s /etc/shadow to-shadow; ln -s / to-root
ln /etc/passwd hardlink-passwd 2>/dev/null && echo HARDLINK=1
mkdir "$(printf 'bad\\377\\376name')" "$(printf 'new\\nline')" "$(printf 'n%.0s' $(seq 255))" && echo NAMES=1
mkdir -p locked/inner && touch locked/inner/f && chmod 000 locked/inner locked && echo LOCKED=1
mkdir readonly && touch readonly/f && chmod 500 readonly
mkdir many && (cd many && seq 2000 | xargs touch) && echo MANY=1
touch held
(cd "$p" && mkdir deep && cd deep && for i in $(seq 1500); do
  mkdir dddddddddddddddddddddddddddddddddddddddd && cd dddddddddddddddddddddddddddddddddddddddd || exit 1
done && touch leaf && echo DEEP=1)
python3 -c '
import errno, os
os.mkdir("flood")
for i in range(1000000):
    try:
        open(f"flood/f{{i}}", "w").close()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
        print("INODES_FULL=1")
        break
'
rm -f flood/f0 flood/f1
dd if=/dev/zero of=big bs=1M count=200 2>/dev/null || echo FULL=1
df -P "$p" | tail -1 | awk '{{print "PIPE_FS=" $6}}'
df -P {STATE}/jobs | tail -1 | awk '{{print "STATE_FS=" $6}}'
touch {FULL_MARK}
for i in $(seq 240); do [ -e {HELD} ] && break; sleep 0.5; done
echo DONE=1
"""

# a second job of alice's keeps a file open inside the first one's pipe dir across its end
HOLD = f"""exec 3<"$1/junk/held" || exit 1
touch {HELD}
sleep 600
"""


@pytest.fixture(scope="module")
def lab():
    yield from own_cluster(
        "pipedir", PROJECT, lambda work: health_policy(work / "small-lab-health.yaml"), "GPUSHARE_PIPE_DIR_KEEP"
    )


def drained(c) -> dict[str, list[str]]:
    return {n: s["flags"] for n, s in c.node_states().items() if any(f.startswith("DRAIN") for f in s["flags"])}


def health(c) -> tuple[int, str]:
    res = c.exec(NODE, ["env", f"SLURMD_NODENAME={NODE}", PROGRAM], check=False, timeout=300)
    return res.returncode, res.stdout + res.stderr


def test_a_job_that_fills_and_deepens_its_pipe_dir_drains_nothing_and_leaves_nothing(lab):
    c = lab
    uid = node_shell(c, NODE, "id -u alice").stdout.strip()
    key = f"{STATE}/mps/g0-u{uid}-p25"
    shadow = node_shell(c, NODE, "sha256sum /etc/shadow /etc/passwd").stdout
    filler = submit(c, FILL, user="alice", account="physics", gres="mps:25")
    holder = None
    try:
        wait_for(
            "alice's pipe dir",
            lambda: node_shell(c, NODE, f"test -d {key}/pipe/junk", check=False).returncode == 0,
            180,
        )
        holder = c.sbatch(
            HOLD.replace('"$1"', f"{key}/pipe"),
            user="alice",
            account="physics",
            nodelist=NODE,
            output="/shared/hooks-%j.out",
        )
        wait_for(
            "alice's pipe dir full",
            lambda: c.exec("slurmctld", ["test", "-e", FULL_MARK], check=False).returncode == 0,
            300,
        )
        neighbour = submit(c, NEIGHBOUR, gres="mps:25", nodelist=NODE)  # carol's
        _rec, near = finished(c, neighbour, timeout=300)
        seen = env_of(near)
        assert seen.get("NEIGHBOUR_DAEMON") == "1", near
        assert seen["NEIGHBOUR_FS"] != key and seen["NEIGHBOUR_FS"].startswith(f"{STATE}/mps/g0-u"), near
        _rec, out = finished(c, filler, timeout=600)
        told = env_of(out)
        assert told.get("DONE") == "1" and told.get("DEEP") == "1" and told.get("MANY") == "1", out
        assert told.get("FULL") == "1" and told.get("INODES_FULL") == "1", f"the pipe dir was not filled: {out}"
        assert told["PIPE_FS"] == key, f"alice's key dir is not a tmpfs of its own: {out}"
        assert told["PIPE_FS"] != told["STATE_FS"], f"the pipe dirs share the journals' filesystem: {out}"
        wait_clean(c, NODE)
        assert drained(c) == {}, drained(c)
        for run in range(2):
            rc, text = health(c)
            assert rc == 0 and "PROBLEM" not in text, text
            assert drained(c) == {}, (run, drained(c), text)
        left = node_shell(c, NODE, f"ls -A {STATE}/mps; ls -A {STATE}/mps/.aside").stdout.split()
        assert left == [".aside"], f"left under {STATE}/mps: {left}"
        assert mps_daemons(c) == [] and journals(c, NODE) == []
        assert node_shell(c, NODE, "sha256sum /etc/shadow /etc/passwd").stdout == shadow
        print(
            f"\nfilled: {sorted(k for k, v in told.items() if v == '1')}; pipe fs {told['PIPE_FS']}, "
            f"journals on {told['STATE_FS']}; epilog and two health runs clean"
        )
    finally:
        if holder is not None:
            c.slurm(["scancel", str(holder)], check=False)
        c.exec("slurmctld", ["rm", "-f", HELD, FULL_MARK], check=False)
    wait_clean(c, NODE)
    assert drained(c) == {}
