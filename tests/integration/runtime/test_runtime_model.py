"""CPU integration test: a tiny megatron-core GPTModel with our SDPA attention.

Runs megatron's GPTModel, DDP wrapper, finalize_model_grads and distributed
checkpointing in a gloo world of one process.  Two megatron-core calls need
CUDA and are handled as follows:

* ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()``
  (and megatron's DDP buffers allocate there): the module patches
  ``torch.cuda.current_device`` to return ``"cpu"``.
* The ``torch_dist`` checkpoint strategy (``filesystem_async.preload_tensors``)
  calls ``torch.cuda.synchronize()``: patched to a no-op (nothing to wait for).
* The optimizer (``MixedPrecisionOptimizer.__init__`` / ``FP32Optimizer.__init__``
  allocate ``torch.tensor(..., device='cuda')``) and the schedule
  (``forward_backward_no_pipelining`` allocates ``total_num_tokens`` with
  ``device="cuda"``) cannot run on CPU: the optimizer test is skipped without
  CUDA and parameters are updated by hand here instead.
"""

import json
import os
import signal

import pytest

from cpu_world_kit import megatron_cpu_world
import torch

from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import unwrap_model

from dlmspec.backends.megatron.layers import build_layer_spec, build_model
from dlmspec.backends.megatron.objective import AutoregressiveObjective, MaskedDiffusionObjective
from dlmspec.backends.megatron.rng import TRAIN_STREAM
from dlmspec.backends.megatron.checkpointing import load_checkpoint, read_latest_checkpoint, save_checkpoint
from dlmspec.backends.megatron.config import REQUEUE_EXIT_CODE, LoggingConfig
from dlmspec.backends.megatron.metrics import MetricsLogger
from dlmspec.backends.megatron.microbatches import MicrobatchFeed, MicrobatchItem
from dlmspec.backends.megatron.signals import ExitSignalWatcher
from dlmspec.backends.megatron.stage import ObjectiveForwardStep

VOCAB, SEQ, EOD, MASK = 128, 32, 127, 126


@pytest.fixture(scope="module", autouse=True)
def cpu_megatron(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        torch.manual_seed(0)
        yield


def _config(**extra):
    base = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, calculate_per_token_loss=True,
    )
    base.update(extra)
    return TransformerConfig(**base)


def _model(attention="bidirectional", ddp=True):
    return build_model(
        _config(), layer_spec=build_layer_spec(attention=attention, qk_layernorm=True, use_transformer_engine=False),
        vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000,
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False) if ddp else None,
    )


def _batch(seed=0, b=2):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 100, (b, SEQ), generator=g)
    tokens[:, 10] = EOD
    return {
        "tokens": tokens,
        "labels": torch.roll(tokens, -1, dims=1),
        "loss_mask": torch.ones(b, SEQ),
        "position_ids": torch.arange(SEQ).expand(b, SEQ).clone(),
    }


def _step(objective, **kw):
    return ObjectiveForwardStep(objective, seed=7, data_parallel_rank=0, eod_id=EOD, device=torch.device("cpu"), **kw)


def test_forward_backward_through_objective_forward_step_and_ddp():
    model = _model()
    feed = MicrobatchFeed([_batch(0), _batch(1)], num_chunks=1, stream=TRAIN_STREAM)
    feed.start(0)
    forward_step = _step(MaskedDiffusionObjective(MASK))
    losses = []
    for _ in range(2):  # two microbatches accumulate into the DDP grad buffer
        output, loss_func = forward_step(feed.data_iterator(), model[0])
        assert output.shape == (2, SEQ) and output.dtype == torch.float32
        loss_sum, num_tokens, report = loss_func(output)
        assert int(num_tokens) == 2 * SEQ
        assert torch.isfinite(loss_sum) and float(report["lm loss"][1]) == 2 * SEQ
        loss_sum.backward()
        losses.append(float(loss_sum))
    total_tokens = torch.tensor(4 * SEQ, dtype=torch.int)
    finalize_model_grads(model, num_tokens=total_tokens)
    grads = {n: p.main_grad for n, p in unwrap_model(model[0]).named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert float(grads["embedding.word_embeddings.weight"].abs().sum()) > 0
    assert float(grads["decoder.layers.1.self_attention.linear_qkv.weight"].abs().sum()) > 0
    assert float(grads["decoder.layers.0.self_attention.q_layernorm.weight"].abs().sum()) > 0
    # Only the masked tokens' embedding rows of the *input* get gradient: the
    # mask id row must, unused ids (100..125) must not.
    emb = grads["embedding.word_embeddings.weight"]
    assert float(emb[MASK].abs().sum()) > 0 and float(emb[100:MASK].abs().sum()) == 0


def test_loss_falls_with_manual_sgd_on_a_constant_batch():
    model = _model()
    forward_step = _step(MaskedDiffusionObjective(MASK))
    item = MicrobatchItem(TRAIN_STREAM, 0, 0, _batch(3))
    params = [p for p in model[0].parameters()]
    history = []
    for _ in range(15):
        model[0].zero_grad_buffer()
        output, loss_func = forward_step(iter([item]), model[0])
        loss_sum, num_tokens, _ = loss_func(output)
        loss_sum.backward()
        finalize_model_grads(model, num_tokens=num_tokens.clone())
        with torch.no_grad():
            for p in params:
                p -= 0.05 * p.main_grad
        history.append(float(loss_sum / num_tokens))
    assert history[-1] < 0.7 * history[0]


def test_variable_length_and_document_masks_through_the_model():
    model = _model(ddp=False)
    forward_step = _step(MaskedDiffusionObjective(MASK, variable_length_prob=1.0), reset_attention_mask=True)
    item = MicrobatchItem(TRAIN_STREAM, 0, 0, _batch(4))
    ob, _, attention_mask = forward_step.prepare(item)
    assert attention_mask.shape == (2, 1, SEQ, SEQ)
    output, loss_func = forward_step(iter([item]), model[0])
    assert torch.isfinite(output).all()
    loss_sum, num_tokens, _ = loss_func(output)
    assert int(num_tokens) == int(ob.lengths.sum())


def test_pipeline_stages_rebuild_identical_inputs_and_dp_ranks_differ():
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=0.5)
    item = MicrobatchItem(TRAIN_STREAM, 12, 3, _batch(5, b=4))
    first_stage, last_stage = _step(obj).prepare(item)[0], _step(obj).prepare(item)[0]
    assert torch.equal(first_stage.input_ids, last_stage.input_ids)
    assert torch.equal(first_stage.loss_weights, last_stage.loss_weights)
    other_dp = ObjectiveForwardStep(obj, seed=7, data_parallel_rank=1, eod_id=EOD, device=torch.device("cpu"))
    assert not torch.equal(other_dp.prepare(item)[0].masked, first_stage.masked)


def test_microbatch_feed_gives_every_chunk_the_same_sequence():
    batches = [_batch(i) for i in range(4)]
    feed = MicrobatchFeed(batches, num_chunks=2, stream=TRAIN_STREAM)
    feed.start(5)
    chunk0, chunk1 = feed.data_iterator()
    a = [next(chunk0) for _ in range(2)]
    b = [next(chunk1) for _ in range(2)]
    assert [x.index for x in a] == [0, 1] == [x.index for x in b]
    assert all(x.iteration == 5 for x in a + b)
    assert torch.equal(a[1].batch["tokens"], b[1].batch["tokens"])
    feed.start(6)
    assert torch.equal(next(chunk1).batch["tokens"], batches[2]["tokens"])


def test_autoregressive_causal_model():
    model = _model(attention="causal", ddp=False)
    output, loss_func = _step(AutoregressiveObjective())(iter([MicrobatchItem(TRAIN_STREAM, 0, 0, _batch(6))]), model[0])
    loss_sum, num_tokens, _ = loss_func(output)
    assert int(num_tokens) == 2 * SEQ
    # Untrained model: per-token CE near log(vocab).
    assert abs(float(loss_sum / num_tokens) - torch.log(torch.tensor(float(VOCAB)))) < 1.0


def test_checkpoint_roundtrip_and_latest_tracker(tmp_path):
    model = _model()
    root = str(tmp_path / "ckpt")
    path = save_checkpoint(root, iteration=3, model=model, consumed_train_samples=24, seed=11)
    assert read_latest_checkpoint(root) == path
    with open(os.path.join(root, "latest")) as f:
        assert f.read().strip() == "iter_0000003"
    meta = json.load(open(os.path.join(path, "dlmspec.json")))
    assert meta["seed"] == 11 and meta["iteration"] == 3
    saved = {n: p.detach().clone() for n, p in unwrap_model(model[0]).named_parameters()}
    with torch.no_grad():
        for p in model[0].parameters():
            p.add_(1.0)
    loaded = load_checkpoint(path, model=model, seed=11)
    assert (loaded.iteration, loaded.consumed_train_samples, loaded.rng_restored) == (3, 24, True)
    for n, p in unwrap_model(model[0]).named_parameters():
        assert torch.equal(p, saved[n]), n
    with pytest.raises(ValueError, match="seed"):
        load_checkpoint(path, model=model, seed=12)
    # A half-written later checkpoint (no tracker update) is never picked up.
    os.makedirs(os.path.join(root, "iter_0000006"))
    assert read_latest_checkpoint(root) == path


def test_megatron_optimizer_step():
    if not torch.cuda.is_available():
        pytest.skip(
            "megatron.core.optimizer.get_megatron_optimizer needs CUDA: "
            "MixedPrecisionOptimizer.__init__ / FP32Optimizer.__init__ call torch.tensor(..., device='cuda')"
        )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    model = _model()
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-2, clip_grad=1.0), model)
    before = [p.detach().clone() for p in model[0].parameters()]
    output, loss_func = _step(MaskedDiffusionObjective(MASK))(iter([MicrobatchItem(TRAIN_STREAM, 0, 0, _batch(7))]), model[0])
    loss_sum, num_tokens, _ = loss_func(output)
    loss_sum.backward()
    finalize_model_grads(model, num_tokens=num_tokens.clone())
    ok, grad_norm, _ = opt.step()
    assert ok and grad_norm > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model[0].parameters()))


def test_resumed_adam_steps_are_per_parameter_again():
    # What megatron-core 0.16.1's DistributedOptimizer.load_state_dict does without
    # Apex/TE: one step tensor object for every parameter's state.
    from types import SimpleNamespace

    from dlmspec.backends.megatron.optim import unshare_optimizer_steps

    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(3)]
    inner = torch.optim.AdamW(params, lr=1e-3)
    shared = torch.tensor(20.0)
    state = inner.state_dict()
    state["state"] = {i: {"step": shared, "exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)} for i in range(3)}
    inner.load_state_dict(state)
    wrapper = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=inner)])
    assert unshare_optimizer_steps(wrapper) == 3
    for p in params:
        p.grad = torch.ones(4)
    inner.step()
    assert [float(inner.state[p]["step"]) for p in params] == [21.0, 21.0, 21.0]


class _DistributedOptimizerLoad:
    """What megatron-core 0.16.1's ``DistributedOptimizer`` does to torch Adam's per-parameter
    ``step`` on a resume from a ``dp_reshardable`` checkpoint without Apex/TE (seen on the H200:
    a deterministic resumed run left the uninterrupted one at the first update after the stop).
    ``prime_optimizer_state``'s dummy step leaves ``step`` 1 in each state; the loading sharded
    state dict wraps those tensors in ``LocalNonpersistentObject``; ``load_state_dict`` puts one
    tensor holding the checkpoint's step (``param_groups[i]["step"]``) in every state and then
    ``_set_main_param_and_optimizer_states`` copies each wrapped dummy into it: step 1 again."""

    def __init__(self, params) -> None:
        self.optimizer = torch.optim.AdamW(params, lr=1e-3)
        for p in params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()  # _init_optimizer_states_with_dummy_values
        self.optimizer.zero_grad()
        self.param_groups = self.optimizer.param_groups

    def sharded_state_dict(self, state, is_loading=False, metadata=None):
        return {}

    def load_state_dict(self, state_dict) -> None:
        dummies = [s["step"] for s in self.optimizer.state.values()]  # the LocalNonpersistentObjects
        shared = torch.tensor(float(state_dict["optimizer"]["param_groups"][0]["step"]))
        for s in self.optimizer.state.values():
            s["step"] = shared
        for dummy in dummies:
            shared.copy_(dummy)


def test_a_resume_restores_the_checkpoints_adam_step_count(tmp_path):
    model = _model()
    path = save_checkpoint(str(tmp_path / "ckpt"), iteration=100, model=model, consumed_train_samples=8, seed=11)
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(3)]
    optimizer = _DistributedOptimizerLoad(params)
    saved = {"optimizer": {"param_groups": [{"step": 100, "lr": 1e-3}]}, "param_state_sharding_type": "dp_reshardable"}
    import dlmspec.backends.megatron.checkpointing as checkpointing

    real_load = checkpointing.dist_checkpointing.load
    with pytest.MonkeyPatch.context() as mp:  # the fake's state is dropped by the loader: hand it back
        mp.setattr(checkpointing.dist_checkpointing, "load", lambda *a, **k: {**real_load(*a, **k), "optimizer": saved})
        load_checkpoint(path, model=model, optimizer=optimizer, seed=11)
    steps = [optimizer.optimizer.state[p]["step"] for p in params]
    assert [float(s) for s in steps] == [100.0] * 3  # megatron-core left 1.0: Adam's bias correction restarted
    assert len({id(s) for s in steps}) == 3
    for p in params:
        p.grad = torch.ones(4)
    optimizer.optimizer.step()
    assert [float(optimizer.optimizer.state[p]["step"]) for p in params] == [101.0] * 3


def test_exit_signal_watcher_and_requeue_code():
    watcher = ExitSignalWatcher(["SIGUSR1"])
    try:
        assert watcher.any_rank_received(torch.device("cpu")) is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watcher.any_rank_received(torch.device("cpu")) == "SIGUSR1"
    finally:
        watcher.restore()
    with pytest.raises(ValueError):
        ExitSignalWatcher(["SIGNOPE"])
    from dlmspec.errors import REQUEUE_EXIT_CODE as SLURM_REQUEUE

    assert REQUEUE_EXIT_CODE == SLURM_REQUEUE


def test_metrics_logger_writes_jsonl(tmp_path):
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), tensorboard=False, console="plain"), enabled=True)
    logger.record("train", {"iteration": 1, "loss": 2.5}, step=1)
    logger.close()
    lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert lines[0]["event"] == "train" and lines[0]["loss"] == 2.5
    quiet = MetricsLogger(LoggingConfig(run_dir=str(tmp_path / "other")), enabled=False)
    quiet.record("train", {"loss": 1.0})
    assert not (tmp_path / "other").exists()


def test_local_spec_builds_under_sequence_parallel_and_marks_norms():
    # megatron-core's WrappedTorchNorm asserts `not sequence_parallel`; TP2+SP failed to build on
    # two H200s. LocalNorm replaces it in every norm slot (layer norms, q/k norms, the block's
    # final norm) and marks the weights `sequence_parallel` so finalize_model_grads sums their
    # gradients over the TP group.
    from dlmspec.backends.megatron.layers import LocalNorm

    config = _config()
    config.sequence_parallel = True  # TransformerConfig refuses SP at TP=1; the model code does not care
    spec = build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False)
    model = build_model(config, layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ)
    inner = unwrap_model(model[0])
    norms = {n: m for n, m in inner.named_modules() if isinstance(m, torch.nn.RMSNorm)}
    assert {"decoder.final_layernorm", "decoder.layers.0.input_layernorm",
            "decoder.layers.0.self_attention.q_layernorm", "decoder.layers.1.self_attention.k_layernorm"} <= set(norms)
    assert all(getattr(p, "sequence_parallel", False) for m in norms.values() for p in m.parameters())
    assert not getattr(inner.decoder.layers[0].self_attention.linear_qkv.weight, "sequence_parallel", False)
    # (The SP forward forks megatron's CUDA RNG tracker: it runs on the GPU, bench/gpu/session_x2.sh.)
    # Without sequence parallelism the norms are plain (no attribute set to True).
    plain = unwrap_model(_model(ddp=False)[0])
    assert not any(getattr(p, "sequence_parallel", False) for n, p in plain.named_parameters() if "norm" in n)
    with pytest.raises(ValueError, match="zero_centered"):
        LocalNorm(_config(layernorm_zero_centered_gamma=True), 64)


@pytest.mark.parametrize("tied", [False, True])
def test_fused_linear_cross_entropy_matches_megatrons_loss_and_gradients(tied):
    # kernels.cross_entropy="fused_linear": the output layer hands back hidden states and the
    # forward step's loss function projects only the masked rows. Same loss and gradients as
    # GPTModel's own logits + cross entropy (fp32 model on CPU).
    torch.manual_seed(3)
    model = build_model(
        _config(), layer_spec=build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False),
        vocab_size=VOCAB, max_sequence_length=SEQ, share_embeddings_and_output_weights=tied,
    )
    def loss_and_grads(step):
        feed = MicrobatchFeed([_batch(5)], num_chunks=1, stream=TRAIN_STREAM)
        feed.start(0)
        for p in model[0].parameters():
            p.grad = None
        output, loss_func = step(feed.data_iterator(), model[0])
        loss_sum, num_tokens, report = loss_func(output)
        loss_sum.backward()
        return output, float(loss_sum), int(num_tokens), {n: p.grad.clone() for n, p in model[0].named_parameters()}

    out_ref, ref, n_ref, g_ref = loss_and_grads(_step(MaskedDiffusionObjective(MASK)))
    step = _step(MaskedDiffusionObjective(MASK))
    assert step.use_fused_linear_cross_entropy(model, "auto") == "torch"  # no Liger/CUDA here
    out, got, n, g = loss_and_grads(step)
    assert out_ref.shape == (2, SEQ) and out.shape == (2, SEQ, 64)  # per-token loss vs hidden states
    assert n == n_ref and abs(got - ref) <= 1e-4 * abs(ref)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-3, atol=1e-6, msg=name)


def test_optimizer_state_is_loaded_without_autograd(tmp_path):
    # fp32 runs: megatron's distributed optimizer copies loaded state in place into views of
    # the model's leaf parameters, which autograd refuses in grad mode (resuming an fp32 run
    # failed on the H200 with "a view of a leaf Variable that requires grad is being used in an
    # in-place operation"). load_checkpoint loads optimizer state under no_grad.
    model = _model()
    root = str(tmp_path / "ckpt")
    path = save_checkpoint(root, iteration=1, model=model, consumed_train_samples=8, seed=11)

    class ViewCopyingOptimizer:  # what DistributedOptimizer._set_main_param_and_optimizer_states does
        def __init__(self, param):
            self.view = param.view(-1)

        def sharded_state_dict(self, state, is_loading=False, metadata=None):
            return {}

        def load_state_dict(self, state_dict):
            self.view.copy_(torch.zeros_like(self.view))

    param = next(unwrap_model(model[0]).parameters())
    assert param.requires_grad and param.is_leaf
    with pytest.raises(RuntimeError, match="leaf Variable"):  # the failure, outside no_grad
        ViewCopyingOptimizer(param).load_state_dict({})
    import dlmspec.backends.megatron.checkpointing as checkpointing

    real_load = checkpointing.dist_checkpointing.load
    with pytest.MonkeyPatch.context() as mp:  # the fake's empty state is dropped by the loader: hand it back
        mp.setattr(checkpointing.dist_checkpointing, "load", lambda *a, **k: {**real_load(*a, **k), "optimizer": {}})
        load_checkpoint(path, model=model, optimizer=ViewCopyingOptimizer(param), seed=11)


def test_micro_batch_cut_runs_the_model_dense_and_ranks_agree():
    """objective.variable_length = "micro_batch": every row and its position ids are
    sliced to one length, with no attention mask; another data-parallel rank (other masks) cuts
    the same micro-batch to the same length; evaluation never cuts; the loss normalisations
    report in their own units."""
    from dlmspec.backends.megatron.rng import VALID_STREAM

    model = _model()
    obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1,
                                   variable_length_prob=1.0, variable_length="micro_batch")
    item = next(MicrobatchItem(TRAIN_STREAM, it, 1, _batch(7, b=3)) for it in range(100)
                if _step(obj).prepare(MicrobatchItem(TRAIN_STREAM, it, 1, _batch(7, b=3)))[0].input_ids.shape[1] < SEQ)
    ob, position_ids, attention_mask = _step(obj).prepare(item)
    cut = ob.input_ids.shape[1]
    assert cut < SEQ and attention_mask is None and position_ids.shape == (3, cut)
    assert torch.equal(position_ids, torch.arange(cut).expand(3, cut))
    assert torch.all(ob.masked.sum(dim=1) >= 1)
    other = ObjectiveForwardStep(obj, seed=7, data_parallel_rank=1, eod_id=EOD, device=torch.device("cpu"))
    assert other.prepare(item)[0].input_ids.shape[1] == cut
    valid = MicrobatchItem(VALID_STREAM, item.iteration, item.index, item.batch)
    assert _step(obj).prepare(valid)[0].input_ids.shape[1] == SEQ
    output, loss_func = _step(obj, loss_normalization="micro_batch")(iter([item]), model[0])
    assert output.shape == (3, cut)
    loss_sum, num_tokens, report = loss_func(output)
    assert int(num_tokens) == 3 * cut and torch.isfinite(loss_sum)
    torch.testing.assert_close(report["lm loss"], torch.stack([loss_sum.detach() / (3 * cut), torch.tensor(1.0)]))
    output, loss_func = _step(obj, loss_normalization="sequence")(iter([item]), model[0])
    seq_sum, rows, _ = loss_func(output)
    assert int(rows) == 3
    torch.testing.assert_close(seq_sum, loss_sum / cut, rtol=1e-5, atol=1e-6)  # equal rows: sum of row means
