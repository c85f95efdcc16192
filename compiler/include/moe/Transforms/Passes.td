//===- Passes.td - passes of the moe compiler ---------------*- tablegen -*-===//
#ifndef MOE_TRANSFORMS_PASSES_TD
#define MOE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def MoESpecializeWorkload : Pass<"moe-specialize-workload", "mlir::ModuleOp"> {
  let summary = "fix the workload the plan is compiled for";
  let description = [{
    Records `moe.workload = {max_batch_tokens, max_seq_len, max_sequences}`
    on the module: the most tokens one step processes, the longest sequence
    (prompt + generated) and the most sequences in flight. Every buffer and
    KV-cache size of the plan follows from these. Fails when max_seq_len
    exceeds the model's `moe.max_position_embeddings`.
  }];
  let options = [
    Option<"maxBatchTokens", "max-batch-tokens", "int64_t", "512",
           "most tokens processed in one step (prefill chunk)">,
    Option<"maxSeqLen", "max-seq-len", "int64_t", "2048",
           "longest sequence, prompt plus generated tokens">,
    Option<"maxSequences", "max-sequences", "int64_t", "8",
           "most sequences in flight (KV-cache slots)">,
  ];
}

def MoEAppendLoss : Pass<"moe-append-loss", "mlir::ModuleOp"> {
  let summary = "end @forward with the training loss (moec compile --train)";
  let description = [{
    Turns the imported model into a training program: @forward takes a
    third argument, `labels` (the next token of each row, -100 for none),
    and returns `moe.lm_loss` (loss, ce, aux, z) instead of the logits:
    `moe.cross_entropy` of the logits against the labels, and after each
    `moe.route` a `moe.router_stats` of its logits when a balancing loss or
    a z-loss is asked for. The balancing loss is the one transformers adds
    with `output_router_logits` (`load_balancing_loss_func`: Mixtral,
    Qwen2-MoE, Qwen3-MoE, OLMoE), its coefficient `router_aux_loss_coef`
    of the carried config.json unless `aux-loss-coef` says otherwise; a
    family for which transformers computes none has none by default.
    DeepSeek-V3 with an explicit coefficient gets the sequence-wise
    balancing loss of the V3 paper (Megatron's seq_aux_loss): its router
    statistics per sequence (`sequences`: the step's B sequences of equal
    length). Other families without one (dense models) refuse a
    coefficient. The function is marked `moe.entry = "train"` (its exec
    program's entry).
  }];
  let options = [
    Option<"auxLossCoef", "aux-loss-coef", "double", "-1.0",
           "balancing-loss coefficient (< 0: the config's router_aux_loss_coef)">,
    Option<"sequences", "sequences", "int64_t", "1",
           "sequences per step (DeepSeek-V3's sequence-wise balancing loss)">,
    Option<"zLossCoef", "z-loss-coef", "double", "0.0",
           "router z-loss coefficient (ST-MoE: mean logsumexp^2, summed over layers)">,
  ];
}

def MoEDifferentiate : Pass<"moe-differentiate", "mlir::ModuleOp"> {
  let summary = "the backward pass of a training program";
  let description = [{
    After moe-append-loss: appends to @forward the gradient of its loss with
    respect to every weight, op by op in reverse order through each op's
    adjoint rule (AdjointOpInterface, dialects/lib/MoE/IR/Adjoints.cpp).
    Gradients reaching one value (or one weight, as a tied embedding table's)
    from several ops are added in the order the adjoints produce them. The
    saved activations are the forward values the gradient ops read. @forward
    then returns the loss and one f32 gradient per weight, in the order the
    ops first bind the weights, each result marked `moe.gradient_of` with
    the weight's checkpoint name. An op without a rule is refused by name.

    Each moe.experts first becomes moe.experts_saved, whose gate/up
    products and expert outputs moe.experts_grad reads, unless
    `recompute-experts` (moec compile --recompute experts): then
    moe.experts_grad recomputes them (three more products per expert, none
    of those activations kept between the passes). `capacity-factor` (moec
    compile --train --capacity-factor) gives the experts moe.dispatch's
    position drop policy, in the backward pass too.
  }];
  let options = [
    Option<"recomputeExperts", "recompute-experts", "bool", "false",
           "recompute the experts' intermediates in the backward pass instead of saving them">,
    ListOption<"expertsLayers", "experts-layers", "int64_t",
               "with recompute-experts: only the experts of these decoder layers (default: "
               "all; moec's planner chooses per pipeline stage)">,
    Option<"capacityFactor", "capacity-factor", "double", "0",
           "the experts' capacity factor (moe.experts_saved's drop policy; 0: dropless)">,
  ];
}

def MoERecomputeLayers : Pass<"moe-recompute-layers", "mlir::ModuleOp"> {
  let summary = "recompute each decoder layer's activations in the backward pass (--recompute full)";
  let description = [{
    On each differentiated per-rank train program (after moe-partition, the
    last CSE and before moe-fuse-add-norm and moe-assign-buffers): the
    forward values that only their own decoder layer reads (a layer is the
    ops of one `layer N` weight set and the weightless ops fed by them; the
    embedding before and the final norm, head and loss after are not
    layers) are no longer read by the backward pass. Instead, before the
    first gradient op that reads one, the ops that compute it from the
    values that cross a layer boundary (the residual stream, the routing
    statistics the loss reads) are cloned, and the gradient ops read the
    clones. What stays alive between the passes is then the boundary
    values; one layer's activations are alive at a time in the backward
    pass. The clones compute exactly what the originals did (the same ops
    on the same operands), so the gradients equal those of saving
    everything bit for bit. Ops with side effects (collectives) are never
    cloned: their results stay saved. Each clone is marked `moe.recomputed`
    (a step's `recompute` in the plan). A cloned attention writes its
    original's KV cache (`moe.recomputes_cache_of`: the original's place
    among the program's attentions, which moe-assign-buffers turns into
    the same cache). `layers`: only those decoder layers (default: all; the
    planner's choice per pipeline stage). Over pipeline stages (moe.sharding
    with pp > 1) the pass runs on the whole program before moe-partition,
    which keeps the boundary values for each stage's backward function
    and gives the clones their layer's stage; the clones' collectives are
    inserted as the originals' are.
  }];
  let options = [
    ListOption<"layers", "layers", "int64_t",
               "only these decoder layers (default: all)">,
  ];
}

def MoEAppendOptimizer : Pass<"moe-append-optimizer", "mlir::ModuleOp"> {
  let summary = "give each differentiated train program its optimizer program (AdamW)";
  let description = [{
    After moe-lower-to-exec, for each exec.program of entry `train` that
    returns gradients: the train program adds each gradient into a state
    buffer (`grad_sum:<weight>`, launch `accumulate`) before it returns
    (with one micro-batch per update and replica, the launches that compute
    the gradient write that state instead of a buffer of their own),
    and a new program `@<name>_optimizer` (entry `optimizer`, the same
    stage, the same weights in the same order, `micro_batches`) updates the
    weights once per global batch: `lr_schedule` (the learning rate of the
    step number, its only input), `grad_norm` (the global norm of the mean
    gradients and the clipping coefficient of clip_grad_norm_), then one
    `adamw` per weight (torch.optim.AdamW: decoupled weight decay, bias
    correction; the moments in state buffers `exp_avg:` / `exp_avg_sq:`;
    the weight written in place, `updates_weights`; the gradient sum reset
    to zero). The program returns its `stats` [lr, grad_norm, clip_coef,
    skipped]: a gradient norm that is not finite skips every `adamw` (no
    weight moves, the sums are cleared).
    Every weight with a gradient is a parameter, an all-zero gradient
    included (its moments decay and the weight decays: never "missing").
    A routing with a score-correction bias (DeepSeek-V3's
    e_score_correction_bias, which takes no gradient) gets DeepSeek's
    auxiliary-loss-free update instead: the train program counts each
    expert's selections into a state buffer (`expert_load:<bias>`, launch
    `count_experts` right after the routing) and the optimizer moves the
    bias by `expert-bias-update-rate` x sign(mean load - load) once per
    update (`expert_bias_update`), from the integer counts of all its
    micro-batches. A bf16 weight gets an f32 master weight (state
    `master:<weight>`, the weight's values at the first update): `adamw`
    updates the master and writes its bf16 rounding into the weight. Refuses
    weights of other dtypes.
    With `zero=1` over data-parallel replicas (ZeRO stage 1), the
    optimizer's own states (the moments and a bf16 weight's master) are
    sharded between the replicas: each such state buffer holds ceil(R /
    dp) of the R rows of its weight's state view (`logical_rows` = R,
    replica d rows [d k, (d + 1) k)); `adamw` updates the replica's rows of
    the weight and each weight is then gathered whole over the dp group
    (`exec.collective "all_gather" ... weights(%w) {shard_rows = k}`). The
    gradient sums stay whole on each replica, but each needs only its rows
    of their total: a `reduce_scatter` over dp of each sum (and its error)
    in place, and the norm from the replicas' rows (`sum_squares` with
    `replicas`, an all_reduce of its value and error, `grad_norm` with
    `from_squares`). With `zero=2` (ZeRO-2) the gradient sums
    (and their errors) are shards as well: the train program adds each
    micro-batch's gradient into them with a `reduce_scatter` over dp (every
    replica's rows of the shard, in replica order) instead of
    `accumulate`, and the norm is the square root of `sum_squares` (each
    replica's over its shards, a value and its error) added over dp
    (`all_reduce`), read by `grad_norm` with `from_squares`.
  }];
  let options = [
    Option<"zero", "zero", "int64_t", "0",
           "ZeRO stage over the dp replicas: 0 (states replicated), 1 (the "
           "optimizer's states sharded) or 2 (the gradient sums too)">,
    Option<"lr", "lr", "double", "1e-3", "the peak learning rate">,
    Option<"minLr", "min-lr", "double", "0", "the cosine schedule's final learning rate">,
    Option<"schedule", "schedule", "std::string", "\"constant\"",
           "constant or cosine (linear warmup, then cosine decay to min-lr)">,
    Option<"warmupSteps", "warmup-steps", "int64_t", "0",
           "steps of linear warmup (lr x step / warmup-steps)">,
    Option<"decaySteps", "decay-steps", "int64_t", "0",
           "the step at which the cosine decay reaches min-lr">,
    Option<"beta1", "beta1", "double", "0.9", "AdamW's beta1">,
    Option<"beta2", "beta2", "double", "0.999", "AdamW's beta2">,
    Option<"eps", "eps", "double", "1e-8", "AdamW's epsilon">,
    Option<"weightDecay", "weight-decay", "double", "0.01", "AdamW's decoupled weight decay">,
    Option<"clipGradNorm", "clip-grad-norm", "double", "0",
           "clip the gradients to this global norm (0: no clipping)">,
    Option<"microBatches", "micro-batches", "int64_t", "1",
           "micro-batches per update (the gradients are their mean)">,
    Option<"expertBiasUpdateRate", "expert-bias-update-rate", "double", "1e-3",
           "the auxiliary-loss-free balancing's rate: each update moves a routing "
           "correction bias by this much towards the mean load (0: none)">,
  ];
  let dependentDialects = ["::moe::exec::ExecDialect"];
}

def MoEFuseRouter : Pass<"moe-fuse-router", "mlir::ModuleOp"> {
  let summary = "fold a router's logits GEMM and its routing into one moe.router";
  let description = [{
    Rewrites `moe.route` of a `moe.linear` with no bias whose only user it
    is (the gate's logits, as the importer emits them) into one
    `moe.router`: one step that computes the logits into scratch and applies
    the routing epilogue, instead of a logits buffer between two steps.
    Other `moe.route` ops stay as they are (every target runs them).
    `moec compile --no-fuse` leaves them all unfused.
  }];
}

def MoEQuantizeWeights : Pass<"moe-quantize-weights", "mlir::ModuleOp"> {
  let summary = "mark the matrices of linear layers and experts for int8 weights";
  let description = [{
    `moec compile --weight-format int8`: every weight whose uses are all the
    matrix of a `moe.linear` (but a router's: a `moe.linear` whose logits
    feed `moe.route`), of a `moe.mlp` or the stacks of a `moe.experts`
    gets `moe.int8_block = <block>`: moert quantises it at load to
    symmetric int8 with one f32 scale per row and block of `block` columns
    (docs/quantization.md). The IR still computes with the weight as
    stored; embeddings, norms, routers and biases are left as they are.
    Refuses FP8-stored weights (`moe.fp8_block`).
  }];
  let options = [
    Option<"format", "format", "std::string", "\"int8\"", "the weight format (int8)">,
    Option<"block", "block", "int64_t", "128", "columns per scale">,
  ];
}

def MoESplitEntries : Pass<"moe-split-entries", "mlir::ModuleOp"> {
  let summary = "one nested module per entry point: prefill and decode";
  let description = [{
    Copies the model (after moe-specialize-workload and moe-choose-layout:
    both entries keep its layout, hence its weights) into two nested
    modules, `module @prefill` with the module's workload and `module
    @decode` with max_batch_tokens = `decode-max-batch-tokens` (0: the
    workload's max_sequences, one token per sequence, at most its
    max_batch_tokens: moert decodes more sequences in turns). The passes
    after it
    run on each nested module (the pipeline nests them: the dispatch
    capacity, the buffers and the kernels follow each entry's workload) and
    `moe-join-entries` gathers their programs.
  }];
  let options = [
    Option<"decodeMaxBatchTokens", "decode-max-batch-tokens", "int64_t", "0",
           "most tokens of a decode step (0: max_sequences, at most max_batch_tokens)">,
  ];
}

def MoEJoinEntries : Pass<"moe-join-entries", "mlir::ModuleOp"> {
  let summary = "gather the entries' exec programs into one module with a schedule";
  let description = [{
    After moe-split-entries and moe-lower-to-exec on each nested module:
    moves every exec.program into the outer module (the prefill entry's
    first, each stage in order, then the decode entry's, renamed
    `@<name>_decode`), sets each program's `entry` and, where its workload
    differs from the prefill entry's, its `max_batch_tokens`, takes the
    prefill module's attributes and records `moe.schedule = {decode =
    "decode", prefill = "prefill"}` (which entry runs each phase of
    generation). Fails when the entries of a stage differ in their weights
    or KV caches (the runtime binds them once per rank and shares them).
  }];
}

def MoEFuseAddNorm : Pass<"moe-fuse-add-norm", "mlir::ModuleOp"> {
  let summary = "fuse a residual moe.add with the norm that first reads its sum";
  let description = [{
    Rewrites `moe.add` whose first reader (in block order) is a
    `moe.rms_norm` or `moe.layer_norm` of the sum into one `moe.add_norm`
    in the norm's place, which yields the sum (for the later readers of the
    residual stream) and the normalised rows: one pass over each residual
    row on every backend. Adds read first by anything else stay. The
    pipeline runs it after `moe-partition` (whose tensor-parallel rules place
    all_reduces at adds) and before `moe-assign-buffers`; `moec compile
    --no-fuse` skips it.
  }];
}

def MoEAssignBuffers : Pass<"moe-assign-buffers", "mlir::ModuleOp"> {
  let summary = "assign every activation to a reusable buffer by liveness";
  let description = [{
    Walks each program (`@forward`, or every `@stage<s>` of a partitioned
    module) in order and gives each activation value a buffer id
    (`moe.buffers` on its defining op, one id per result; `moe.arg_buffers`
    on the function for its arguments). A buffer is freed after the last use
    of its value and reused by a later value of the same element type and
    row width (so a buffer's width is the row stride of every value in it); ops that may write their result over a dying operand of
    the same width (add, sigmoid_gate, rope, rms_norm) reuse that operand's
    buffer. Each program gets `moe.buffer_rows` / `moe.buffer_widths` /
    `moe.buffer_types`: per buffer, its rows (-1: max_batch_tokens; static
    values such as a dispatch buffer [E, C, H] have E x C), row width and
    element type; its size in bytes is rows x width x element size. Attention ops get a KV-cache id
    (`moe.kv_cache`).
  }];
}

def MoELowerToExec : Pass<"moe-lower-to-exec", "mlir::ModuleOp"> {
  let summary = "lower each rank program to the exec dialect";
  let description = [{
    After moe-assign-buffers: each program (`@forward`, or every `@stage<s>`)
    becomes an `exec.program` (entry `forward`, its stage) that declares its
    buffers (rows resolved against the workload), its weights in the order
    its launches first bind them, its KV caches and its inputs, then one
    `exec.launch` (the op's kernel id and constants) or `exec.collective`
    (all_reduce / all_gather / all_to_all over a mesh axis, send / recv to a
    stage) per op, in order, and `exec.return` with the logits' buffer. The
    model's logical weights stay on the module (`moe.logical_weights`).
    Diagnoses programs without buffers, weights no op binds and KV caches
    out of order.
  }];
  let dependentDialects = ["::moe::exec::ExecDialect"];
}

def MoEChooseLayout : Pass<"moe-choose-layout", "mlir::ModuleOp"> {
  let summary = "choose the expert / tensor / pipeline / data layout and apply it";
  let description = [{
    The sharding planner as a pass: searches the layouts of the machine's
    ranks for the module (the config.json named by `moe.source`, the
    workload of `moe.workload`) with the cost and memory model
    (docs/sharding.md), records the request and the choice as `moe.layout`
    and annotates the weights with it (runs `moe-plan-sharding` with the
    chosen degrees and stages). `explain` and `json` print the choice, its
    alternatives and the rejections to standard output (`moec compile
    --explain` / `--json`). moe-emit-plan writes each rank's slices and
    predicted memory from `moe.layout`.
  }];
  let dependentDialects = ["mlir::mesh::MeshDialect"];
  let options = [
    Option<"worldSize", "world-size", "int64_t", "0", "ranks to plan for (0: one, or the cluster file's)">,
    Option<"gpu", "gpu", "std::string", "\"\"", "built-in machine: h100, h200, a100, b200 or cpu">,
    Option<"cluster", "cluster", "std::string", "\"\"", "a cluster description (JSON file)">,
    Option<"dp", "dp", "int64_t", "0", "fixed data-parallel degree (0: free)">,
    Option<"pp", "pp", "int64_t", "0", "fixed pipeline-parallel degree (0: free)">,
    Option<"tp", "tp", "int64_t", "0", "fixed tensor-parallel degree (0: free)">,
    Option<"ep", "ep", "int64_t", "0", "fixed expert-parallel degree (0: free)">,
    Option<"etp", "etp", "int64_t", "0", "fixed expert tensor-parallel degree (0: free)">,
    Option<"vocabPadTo", "vocab-pad-to", "int64_t", "64", "pad the vocabulary to a multiple of this x tp">,
    Option<"dtype", "dtype", "std::string", "\"\"", "weight dtype counted: bf16, f16, f32, fp8 (default: the config's)">,
    Option<"explain", "explain", "bool", "false", "print the choice, alternatives and rejections">,
    Option<"json", "json", "bool", "false", "print the layout and the search as JSON">,
  ];
}

def MoEPlanSharding : Pass<"moe-plan-sharding", "mlir::ModuleOp"> {
  let summary = "annotate every weight with its sharding on the device meshes";
  let description = [{
    Applies a layout (the degrees the planner chose, `moec compile
    --explain` says why) to the module: adds the two meshes of Megatron-Core's
    parallel folding over the same ranks, `@mesh` (PP x DP x TP) for
    attention and dense parts and `@experts` (PP x EDP x EP x ETP) for routed
    experts, and a `mesh.shard` after every weight: column-parallel weights
    split dim 0 over TP (mesh axis 2), row-parallel ones dim 1, the embedding
    and LM head split along the (padded) vocabulary over TP, routed expert
    stacks split dim 0 over EP (`@experts` axis 2) and their intermediate dim
    over ETP (axis 3); norms, routers and MLA's down-projections are
    replicated (`[[]]`). The module gets `moe.sharding` with the degrees,
    the padded vocabulary and the first layer of each pipeline stage. The
    model's classification comes from the config.json named by `moe.source`.
  }];
  let dependentDialects = ["mlir::mesh::MeshDialect"];
  let options = [
    Option<"dp", "dp", "int64_t", "1", "data-parallel degree">,
    Option<"pp", "pp", "int64_t", "1", "pipeline-parallel degree">,
    Option<"tp", "tp", "int64_t", "1", "tensor-parallel degree">,
    Option<"ep", "ep", "int64_t", "1", "expert-parallel degree">,
    Option<"etp", "etp", "int64_t", "1", "expert tensor-parallel degree">,
    Option<"vocabPadTo", "vocab-pad-to", "int64_t", "64",
           "pad the vocabulary to a multiple of this x tp">,
    ListOption<"stageBegin", "stage-begin", "int64_t",
               "first layer of each pipeline stage (default: even split)">,
  ];
}

def MoELowerRouting : Pass<"moe-lower-routing", "mlir::ModuleOp"> {
  let summary = "lower routed experts to capacity-limited dispatch, expert_ffn and combine";
  let description = [{
    Rewrites each `moe.experts` into `moe.dispatch` (every kept (token,
    choice) row into its expert's block of C slots; C from `capacity-factor`
    and the workload's max_batch_tokens, docs/partitioned-execution.md),
    `moe.expert_ffn` (each expert's MLP over its block) and `moe.combine`
    (the weighted sum per token). It runs when a layout needs the blocks:
    a capacity factor, or expert or tensor parallelism in `moe.sharding`;
    otherwise `moe.experts` stays (grouped GEMMs over the routed rows). The
    pipeline runs it after moe-plan-sharding and before moe-partition, which
    then places the blocks (all_to_all over EP, row parts over TP).
  }];
  let options = [
    Option<"capacityFactor", "capacity-factor", "double", "0.0",
           "expert capacity factor; 0: dropless">,
  ];
}

def MoEPartition : Pass<"moe-partition", "mlir::ModuleOp"> {
  let summary = "one program per pipeline stage, with rank-local shapes and marked communication";
  let description = [{
    Rewrites the sharded `@forward` (after moe-plan-sharding,
    moe-specialize-workload and moe-lower-routing) into `@stage0 ..
    @stage<pp-1>` (attribute `moe.stage`), each run by every rank of its
    stage: weights get the rank-local shapes of their sharding;
    column-parallel outputs stay split, row-parallel ones are partial sums,
    annotated (`mesh.shard ... partial = sum[2]`, then `annotate_for_users`
    as a whole value) where a user needs them whole, which
    moe-insert-collectives turns into an `moe.all_reduce` over tp;
    attention runs heads / tp; the embedding is vocabulary-sharded and the LM
    head's parts are marked to be made whole (`builtin.unrealized_conversion_cast`
    to the whole type with `moe.gather = {mesh = @mesh, axis = 2}`);
    `moe.dispatch` gets the rank's row part of its TP group, `moe.expert_ffn`
    the local experts, marked under EP with the group its blocks are
    exchanged over (`moe.exchange = {mesh = @experts, axis = 2}`), and
    `moe.combine`'s result is a partial sum under TP (`moe.experts` under
    expert or tensor parallelism is refused: it needs moe-lower-routing);
    values live across a stage cut are the results of the stage that makes
    them (`moe.send_to = s + 1`) and arguments of the next
    (`moe.recv_from = s`), in program order. moe-insert-collectives places
    every collective this leaves marked. The complete semantics are in
    docs/partitioned-execution.md.
  }];
}

def MoEInsertCollectives : Pass<"moe-insert-collectives", "mlir::ModuleOp"> {
  let summary = "turn moe-partition's reshardings into collectives";
  let description = [{
    moe-partition places values and marks where a user needs a partial sum
    whole: `mesh.shard %v to <@mesh, [[]], partial = sum[axes]>` followed by
    `mesh.shard ... to <@mesh, [[]]> annotate_for_users`. This pass replaces
    each such pair by one `moe.all_reduce` over each partial axis, at the
    user's annotation. Any other resharding between two annotations, or a
    partial reduction other than a sum, is an error naming it. An
    `moe.expert_ffn` marked `moe.exchange = {mesh = @experts, axis = N}` gets
    an `moe.all_to_all` of its blocks and counts over that group before it
    and one of its outputs after it. A `builtin.unrealized_conversion_cast`
    marked `moe.gather = {mesh = @mesh, axis = N}` from a part [rows, w] to
    its whole [rows, W] becomes an `moe.all_gather` over that group (w x
    group size columns) and, when that is more than W, a split dropping the
    rest. A stage function's arguments marked `moe.recv_from = s` become
    `moe.recv from s` after its weights and its results marked
    `moe.send_to = s` become `moe.send ... to s` before its return, in
    order; both leave the signature.
  }];
}

def MoEVerifyCollectives : Pass<"moe-verify-collectives", "mlir::ModuleOp"> {
  let summary = "prove that every rank's collectives match (no deadlock)";
  let description = [{
    Simulates every rank of `moe.sharding`'s world on its stage's program
    (the function with `moe.stage` equal to its pp coordinate, or the one
    whose `moe.ranks` lists it): each rank's collectives and sends/receives,
    in program order, must meet their group's (same op, mesh, axis and
    operand types) or their peer's. Programs are straight-line and their
    collectives' shapes static, so the order does not depend on the routing:
    a rank that receives no tokens still takes part. Fails naming the ranks
    and the ops they wait in when the simulation stops before every program
    ends, or when a group meets with different shapes. A collective still
    to be placed (a partial sum marked for moe-insert-collectives, an
    `moe.exchange` mark) is an error: the schedule without it is not the
    one that runs.
  }];
}

def MoESchedulePipeline : Pass<"moe-schedule-pipeline", "mlir::ModuleOp"> {
  let summary = "a pipelined training plan's one-forward-one-backward schedule";
  let description = [{
    For a training module whose stages have forward programs (entry
    `train_forward`, moe-partition over pp > 1) beside their backward ones
    (`train`) and optimizer programs: writes `moe.pipeline_schedule`, per
    stage the steps of an update in order, `F<j>` (the forward program on
    micro-batch j of the replica's `micro_batches` / dp) or `B<j>`, 1F1B:
    stage s runs min(pp - 1 - s, m) forwards, then alternates a forward
    and a backward, then the remaining backwards. A step written `+F<j>` /
    `+B<j>` is fused with the step before: that step's final sends and this
    step's first receives, which go to and come from the same stage, are
    one exchange (each side sends while it receives; blocking sends in 1F1B
    order deadlock: each stage would send to the other first). With
    `unfused`, no step is fused (moe-verify-exec-collectives refuses that
    schedule). Orders the programs train, optimizer, train_forward, each
    entry's by stage.
  }];
  let options = [
    Option<"unfused", "unfused", "bool", "false",
           "fuse no sends with the next step's receives (a schedule that deadlocks)">,
  ];
}

def MoEVerifyExecCollectives : Pass<"moe-verify-exec-collectives", "mlir::ModuleOp"> {
  let summary = "prove that every rank's exec programs issue matching collectives";
  let description = [{
    moe-verify-collectives' proof on the programs a plan is written from
    (after moe-lower-to-exec and moe-append-optimizer): per entry, each rank
    runs the exec.program of that entry whose `moe.ranks` lists it, else
    the one whose stage is its pp coordinate; its exec.collective ops, in
    order, must meet their group's (same kind, mesh, axis, operand shapes
    and constants, e.g. an all_gather's `shard_rows`) or their peer's. A
    training plan's train and optimizer programs are one schedule, an
    update: the train program as many times as a replica runs it
    (`micro_batches` / dp), then the optimizer program; every other entry
    is a schedule of its own. A pipelined training plan's update is its
    `moe.pipeline_schedule` (moe-schedule-pipeline) on each rank, each step
    its forward or backward program's collectives (a fused step's receives
    and the sends before it one exchange, which meets the peer's mirrored
    exchange), then the optimizer program. Programs are straight-line, so no token
    count, empty micro-batch or idle expert changes which collectives a rank
    issues. Fails naming the ranks and the ops they would wait in, or the
    members that meet with different shapes; marks the module
    `moe.exec_collectives_verified`.
  }];
}

def MoECudaKernels : Pass<"moe-cuda-kernels", "mlir::ModuleOp"> {
  let summary = "the CUDA target: generate each exec program's kernels into the IR";
  let description = [{
    The CUDA TargetBackend's pipeline hook (docs/cuda.md), after
    moe-lower-to-exec: generates every program's CUDA kernels from its exec
    ops, specialised to the program's constants, and puts them into the IR:
    each exec.launch gets its `rows` (T, or R after the LM head) and a
    `kernels` region of exec.dispatch (an emitted kernel with its grid in
    terms of the rows, block and parameters) and exec.gemm (a cuBLAS call)
    ops in launch order, each exec.collective its rows (NCCL), and each
    program an exec.kernels op with the CUDA source, the kernel names, the
    scratch sizes, the RoPE tables and the greedy sampler. moe-emit-plan
    with target=cuda writes the kernel table from these ops.
  }];
}

def MoEEmitPlan : Pass<"moe-emit-plan", "mlir::ModuleOp"> {
  let summary = "write the compiled module as a plan (the last pass of moec compile)";
  let description = [{
    Serializes the exec programs (moe-lower-to-exec) as the plan file
    `output` (docs/plan-format.md), written atomically: the programs, the
    model's logical weights and, with `moe.layout` (moe-choose-layout), the
    distribution: degrees, stages and every rank's coordinates, predicted
    memory and checkpoint slices. The `target`'s TargetBackend adds its part:
    with `target=cuda` each program gets its CUDA kernel table, source and
    fatbin (nvcc: $MOE_NVCC or the CUDA toolkit's; docs/cuda.md). Changes
    nothing in the module.
  }];
  let options = [
    Option<"output", "output", "std::string", "\"\"", "the plan file to write">,
    Option<"target", "target", "std::string", "\"cpu\"",
           "the TargetBackend: cpu or cuda">,
    Option<"cudaArch", "cuda-arch", "std::string", "\"sm_80,sm_90\"",
           "with target=cuda: architectures to compile SASS for, plus PTX">,
    Option<"kernelsOnly", "kernels-only", "bool", "false",
           "with target=cuda: no nvcc; the sources beside `output` (stage<i>.cu), "
           "or on standard output without `output`">,
  ];
}

#endif // MOE_TRANSFORMS_PASSES_TD
