"""Two fixes found on the GPU: DataLoader workers survive a stop signal, and megatron-core's MoE
router runs without Transformer Engine."""

import os
import select
import subprocess
import tempfile
from pathlib import Path
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")


def test_worker_ignoring_sigterm_outlives_it():
    # A DataLoader worker with the init function survives the SIGTERM that torchrun sends to the
    # whole process group, and the loader still yields every batch.
    code = textwrap.dedent(
        """
        import os, signal, torch
        from dlmspec.backends.megatron.signals import ignore_exit_signals   # what build_dataloader gives its workers
        signal.signal(signal.SIGTERM, lambda *a: None)   # the rank itself handles it (training.py)
        class Slow(torch.utils.data.Dataset):
            def __len__(self): return 6
            def __getitem__(self, i):
                if i == 1:
                    os.killpg(os.getpgid(0), signal.SIGTERM)   # as torchrun does
                return torch.tensor([i])
        loader = torch.utils.data.DataLoader(Slow(), batch_size=1, num_workers=1, worker_init_fn=ignore_exit_signals)
        print(sum(int(b) for b in loader))
        """
    )
    from dlmspec.backends.megatron import data, signals

    assert data.ignore_exit_signals is signals.ignore_exit_signals  # the loader's workers get this one
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            start_new_session=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "15"


def test_moe_router_runs_without_transformer_engine():
    from megatron.core.transformer.moe import moe_utils

    from dlmspec.backends.megatron.layers import patch_moe_router_without_te

    if moe_utils.HAVE_TE:
        pytest.skip("transformer_engine is installed: megatron-core defines te_general_gemm itself")
    patch_moe_router_without_te()
    assert moe_utils.te_general_gemm is None
    inp = torch.randn(3, 2, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    out = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    torch.testing.assert_close(out, (inp.reshape(-1, 8) @ weight.t()).reshape(3, 2, 4))
    out.sum().backward()
    assert weight.grad is not None and inp.grad is not None
    assert patch_moe_router_without_te() is False  # already defined: nothing to do


def test_checkpoint_helper_survives_a_group_sigterm():
    # megatron-core's checkpoint writer spawns a multiprocessing manager (its results queue);
    # started by prestart_checkpoint_helpers it ignores the SIGTERM torchrun sends to the process
    # group, the queue keeps working, and the rank's own handler still sees the signal.
    # The imports stay under the main guard: spawn's manager re-imports this file, and need not
    # import megatron-core again to serve the queue.
    code = textwrap.dedent(
        """
        import os, signal, time
        if __name__ == "__main__":
            from megatron.core.dist_checkpointing.strategies import filesystem_async
            from dlmspec.backends.megatron.checkpointing import prestart_checkpoint_helpers
            got = []
            signal.signal(signal.SIGTERM, lambda *a: got.append("TERM"))
            prestart_checkpoint_helpers()
            queue = filesystem_async._get_write_results_queue()
            os.killpg(os.getpgid(0), signal.SIGTERM)
            time.sleep(0.5)
            queue.put(7)
            print(queue.get(), got, signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN)
        """
    )
    script = Path(tempfile.mkdtemp()) / "helper_survives.py"  # spawn re-imports __main__ from a file
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            start_new_session=True, cwd=Path(__file__).resolve().parents[3],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "7 ['TERM'] True"


def test_missing_data_files_are_named_before_training(tmp_path):
    from dlmspec.backends.megatron.data import DataConfig, missing_data_files

    present = tmp_path / "have_text_document"
    for suffix in (".bin", ".idx"):
        (tmp_path / f"have_text_document{suffix}").write_bytes(b"x")
    (tmp_path / "half_text_document.bin").write_bytes(b"x")
    config = DataConfig(seq_length=8, vocab_size=10, eod_id=0,
                        blend=[(str(present), 1.0), (str(tmp_path / "half_text_document"), 1.0)],
                        valid_blend=[(str(tmp_path / "gone"), None)])
    assert missing_data_files(config) == [str(tmp_path / "half_text_document.idx"), str(tmp_path / "gone.bin"),
                                          str(tmp_path / "gone.idx")]
    assert missing_data_files(DataConfig(seq_length=8, vocab_size=10, eod_id=0, mock=True)) == []


_FEED_EXIT = textwrap.dedent(
    """
    import sys, torch
    from dlmspec.backends.megatron.signals import ignore_exit_signals
    from dlmspec.backends.megatron.microbatches import MicrobatchFeed
    loader = torch.utils.data.DataLoader(torch.arange(64), batch_size=2, num_workers=2,
                                         worker_init_fn=ignore_exit_signals)
    feed = MicrobatchFeed(loader, 2, 0)          # views and feed form a reference cycle
    feed.start(0)
    print(int(next(feed.iterators[0]).batch.sum()))
    if sys.argv[1] == "close":
        feed.close()
        feed.close()                             # idempotent
    """
)


@pytest.mark.parametrize("close", [True, False])
def test_feed_close_lets_the_rank_exit(close):
    # Regression (H200, nvidia-h200-x2): runs finished training, printed their result and hung
    # at interpreter exit until the runner killed them. multiprocessing's exit hook SIGTERMs the
    # daemonic DataLoader workers (which ignore it) and joins them. MicrobatchFeed.close(),
    # called by train() on every way out, stops them first. Without it the process hangs, which
    # shows the test exercises the real failure: it has printed its result (unbuffered, -u), so
    # only its exit is left, and 10 s later it has not exited.
    args = [sys.executable, "-u", "-c", _FEED_EXIT, "close" if close else "leave"]
    if close:
        result = subprocess.run(args, capture_output=True, text=True, timeout=120, start_new_session=True)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == "1"
        return
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().strip() == b"1", "the rank did not reach its exit"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


_COMPILE_POOL_AFTER_GROUP_SIGTERM = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = 2        # a pool, as on a GPU machine's many cores
    from torch._inductor.async_compile import AsyncCompile
    from dlmspec.backends.megatron.signals import ExitSignalWatcher, shield_compile_workers
    shielded = sys.argv[1] == "shield"
    watcher = ExitSignalWatcher(["SIGTERM"])   # as training.py installs it
    if shielded:
        assert shield_compile_workers(["SIGTERM"], cuda_only=False)
    pool = AsyncCompile.process_pool()
    assert pool.submit(abs, -1).result(timeout=60) == 1   # the workers run
    os.killpg(os.getpgid(0), signal.SIGTERM)            # as torchrun and SLURM stop a rank
    deadline = time.time() + 30
    while watcher.received is None and time.time() < deadline:
        time.sleep(0.05)
    assert watcher.received == "SIGTERM"
    try:
        print("answer", pool.submit(abs, -2).result(timeout=8))   # a compile after the signal
    except Exception as exc:
        print("no answer", type(exc).__name__)
    """
)


@pytest.mark.parametrize("shield", ["shield", "none"])
def test_compile_workers_outlive_a_group_sigterm_only_when_shielded(shield):
    # Inductor's compile workers are children of the rank: a SIGTERM sent to the process group kills
    # them unless they were started with it ignored (shield_compile_workers, which training.py calls
    # after installing the watcher), and a compile after the signal then never gets its answer.
    result = subprocess.run([sys.executable, "-c", _COMPILE_POOL_AFTER_GROUP_SIGTERM, shield], capture_output=True,
                            text=True, timeout=180, start_new_session=True)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = "answer 2" if shield == "shield" else "no answer"
    assert expected in result.stdout, (result.stdout, result.stderr[-2000:])


def test_compile_worker_shield_needs_cuda_by_default_and_known_signals():
    import signal

    from dlmspec.backends.megatron.signals import shield_compile_workers, stop_watcher

    if not torch.cuda.is_available():
        assert shield_compile_workers(["SIGTERM"]) is False  # the runtime compiles only on CUDA
    assert stop_watcher([]) is None  # no stop signals configured: no watcher (training.py)
    before = signal.getsignal(signal.SIGUSR1)
    watcher = stop_watcher(["SIGUSR1"])
    try:
        assert watcher is not None and signal.getsignal(signal.SIGUSR1) == watcher._handle
    finally:
        watcher.restore()
    assert signal.getsignal(signal.SIGUSR1) == before
    assert shield_compile_workers([]) is False
    with pytest.raises(ValueError, match="SIGNOPE"):
        shield_compile_workers(["SIGNOPE"])


_HUNG_AFTER_STOP = textwrap.dedent(
    """
    import os, signal, sys, time
    from dlmspec.backends.megatron.signals import ExitSignalWatcher
    watcher = ExitSignalWatcher(["SIGTERM"], stacks_after_s=float(sys.argv[1]))
    os.kill(os.getpid(), signal.SIGTERM)
    def save_that_hangs():
        time.sleep(float(sys.argv[2]))
    save_that_hangs()                     # the save-and-exit, stuck
    if sys.argv[3] == "restore":
        watcher.restore()
        time.sleep(float(sys.argv[1]) + 1.0)   # disarmed: no stacks
    print("received", watcher.received)
    """
)


def test_a_rank_still_running_after_a_stop_signal_prints_its_stacks():
    # A stop signal arms faulthandler: a rank that has not exited after stacks_after_s prints every
    # thread's stack (the hang seen on an H100 left no trace of where the rank was).
    # both ranks run side by side: each waits out its own seconds
    runs = [subprocess.Popen([sys.executable, "-c", _HUNG_AFTER_STOP, *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for argv in (("1", "3", "keep"), ("2", "0", "restore"))]
    try:
        (hung_out, hung_err), (_, quick_err) = (run.communicate(timeout=120) for run in runs)
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert runs[0].returncode == 0, hung_err[-2000:]
    assert "received SIGTERM" in hung_out
    assert "SIGTERM received; a rank still running 1 s from now prints its threads' stacks" in hung_err
    assert "Timeout (0:00:01)!" in hung_err and "save_that_hangs" in hung_err
    # one that exits in time, or restores the handlers first, prints none
    assert runs[1].returncode == 0 and "Timeout" not in quick_err, quick_err[-2000:]
