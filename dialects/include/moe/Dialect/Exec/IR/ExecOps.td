//===- ExecOps.td - the execution dialect ----------------------*- tablegen -*-===//
//
// The `exec` dialect: what one rank runs, after the `moe` programs have been
// partitioned, fused and given buffers. A program is a list of buffers,
// weights and KV caches it declares, and the launches and collectives that
// read and write them, in order. Kernels are named by id (the op-level kernel
// every target implements: the CPU registry's and the CUDA emitter's), with
// their constants; collectives name their group (a mesh and an axis) or their
// peer stage. The plan writer serializes these programs without knowing any
// model op (moe-emit-plan); docs/dialect.md describes the lowering.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_EXEC_IR_EXECOPS_TD
#define MOE_DIALECT_EXEC_IR_EXECOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"

def Exec_Dialect : Dialect {
  let name = "exec";
  let cppNamespace = "::moe::exec";
  let summary = "per-rank programs: buffers, weights, kernel launches, collectives";
  let description = [{
    The level the runtime executes. Values are handles (`!exec.buffer`,
    `!exec.weight`), not tensors: a buffer is a rows x width region of f32 or
    i32 values that many launches write in turn (the liveness assignment of
    moe-assign-buffers), a weight is this rank's slice of a checkpoint tensor.
    A launch reads `ins` and `weights` and writes `outs`; nothing else is
    implied by the op's name.
  }];
  let useDefaultTypePrinterParser = 1;
}

class Exec_Op<string mnemonic, list<Trait> traits = []>
    : Op<Exec_Dialect, mnemonic, traits>;

def Exec_BufferType : TypeDef<Exec_Dialect, "Buffer"> {
  let mnemonic = "buffer";
  let summary = "a rank-local activation buffer (rows x width)";
}

def Exec_WeightType : TypeDef<Exec_Dialect, "Weight"> {
  let mnemonic = "weight";
  let summary = "this rank's slice of a checkpoint tensor";
}

def Exec_ProgramOp : Exec_Op<"program", [Symbol, IsolatedFromAbove, SingleBlock]> {
  let summary = "one entry point of a rank: declarations, then launches in order";
  let description = [{
    `entry` names what the program computes (`forward`: prefill and decode
    steps alike; `prefill` and `decode`, which a module's `moe.schedule`
    names, with the decode programs' `max_batch_tokens` when smaller;
    `train`: a training step's forward and backward; `optimizer`: the
    update of the weights from the gradients the train steps accumulated,
    moe-append-optimizer), `stage` the pipeline stage whose ranks run it. Buffers, weights and KV caches are
    numbered in the order they are declared; weights in the order launches
    first bind them.

    ```mlir
    exec.program @stage0 entry "forward" stage 0 {
      %b0 = exec.buffer i32 rows 512 width 1
      %w0 = exec.weight "model.norm.weight" : tensor<64xf32>
      ...
      exec.return logits(%b9)
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$entry, I64Attr:$stage);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name `entry` $entry `stage` $stage attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Exec_ReturnOp : Exec_Op<"return", [Terminator, HasParent<"ProgramOp">,
                                        AttrSizedOperandSegments]> {
  let summary = "the end of a program, with the buffers of its results (if any)";
  let description = [{
    `logits`: the inference programs' last stage; `loss`: a training
    program's [loss, ce, aux, z] (moe.lm_loss); `gradients`: a
    differentiated training program's f32 gradient of each weight of
    `of` (moe-differentiate), in the weight's local shape; `stats`: an
    optimizer program's [lr, grad_norm, clip_coef, skipped] of its update.
  }];
  let arguments = (ins Optional<Exec_BufferType>:$logits, Optional<Exec_BufferType>:$loss,
                       Variadic<Exec_BufferType>:$gradients,
                       Variadic<Exec_WeightType>:$gradient_of,
                       Optional<Exec_BufferType>:$stats);
  let assemblyFormat = [{
    (`logits` `(` $logits^ `)`)? (`loss` `(` $loss^ `)`)?
    (`gradients` `(` $gradients^ `)` `of` `(` $gradient_of `)`)? (`stats` `(` $stats^ `)`)?
    attr-dict
  }];
  let hasVerifier = 1;
}

def Exec_BufferOp : Exec_Op<"buffer", [HasParent<"ProgramOp">,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "declares a buffer: rows x width values of f32 or i32";
  let description = [{
    With `state`, the buffer is persistent: it holds its values from one
    run of the program to the next, starts as zeros, and the rank's
    programs that declare a state of the same name share it (a train
    program's gradient sums, the optimizer's moments). With `logical_rows`
    as well, the state is a ZeRO shard: the logical state has
    `logical_rows` rows, and data-parallel replica d holds its rows
    [d rows, (d + 1) rows) (the last replicas' beyond the end are zeros).
    `shard_group = "edp"` shards it over the expert-data-parallel group
    instead (an expert stack's state under expert or tensor parallelism:
    member d of the ranks holding the same experts holds rows
    [d rows, (d + 1) rows) of the rank's experts' state).
    State `stash:<i>` (f32 or i32) is a pipeline stage's value kept from
    its forward program to its backward one: one slot per micro-batch in
    flight, each run binding its micro-batch's.
  }];
  let arguments = (ins TypeAttr:$element_type, I64Attr:$rows, I64Attr:$width,
                       OptionalAttr<StrAttr>:$state, OptionalAttr<I64Attr>:$logical_rows,
                       OptionalAttr<StrAttr>:$shard_group);
  let results = (outs Exec_BufferType:$result);
  let assemblyFormat = "$element_type `rows` $rows `width` $width attr-dict";
  let hasVerifier = 1;
}

def Exec_WeightOp : Exec_Op<"weight", [HasParent<"ProgramOp">,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "declares a weight: this rank's slice of a checkpoint tensor";
  let description = [{
    `tensor_type` is the slice's shape and the checkpoint's dtype; `experts`
    (an expert stack) the number of experts stacked in its leading dimension.
  }];
  let arguments = (ins StrAttr:$tensor, TypeAttr:$tensor_type,
                       OptionalAttr<I64Attr>:$experts);
  let results = (outs Exec_WeightType:$result);
  let assemblyFormat = "$tensor `:` $tensor_type (`experts` $experts^)? attr-dict";
  let hasVerifier = 1;
}

def Exec_KVCacheOp : Exec_Op<"kv_cache", [HasParent<"ProgramOp">]> {
  let summary = "declares a KV cache (key and value row widths), numbered in order";
  let arguments = (ins I64Attr:$key_width, I64Attr:$value_width);
  let assemblyFormat = "`key_width` $key_width `value_width` $value_width attr-dict";
}

def Exec_InputsOp : Exec_Op<"inputs", [HasParent<"ProgramOp">, AttrSizedOperandSegments]> {
  let summary = "the buffers the runtime fills before the first launch";
  let description = [{
    `labels`: a training program's next token of each row (-100: none);
    `step`: an optimizer program's number of the update (i32, from 1),
    which reads no tokens.
  }];
  let arguments = (ins Optional<Exec_BufferType>:$tokens, Optional<Exec_BufferType>:$positions,
                       Optional<Exec_BufferType>:$labels, Optional<Exec_BufferType>:$step);
  let assemblyFormat = [{
    (`tokens` `(` $tokens^ `)`)? (`positions` `(` $positions^ `)`)? (`labels` `(` $labels^ `)`)?
    (`step` `(` $step^ `)`)? attr-dict
  }];
  let hasVerifier = 1;
}

def Exec_LaunchOp : Exec_Op<"launch", [HasParent<"ProgramOp">, AttrSizedOperandSegments,
                                        NoTerminator, SingleBlock]> {
  let summary = "runs a kernel by id with its constants";
  let description = [{
    `kernel` is the op-level kernel id every target implements (the CPU
    runtime's registry, the CUDA emitter); `constants` are its parameters
    (epsilon, heads, the routing attribute as a dictionary, ...), plain
    integers, floats, strings, booleans, arrays and dictionaries.
    `updates_weights` (the optimizer's update kernels only): the launch also
    writes its weights in place.

    ```mlir
    exec.launch "rms_norm" ins(%b2) weights(%w1) outs(%b3) {eps = 1.0e-05 : f64}
    ```

    A GPU target lowers it in place (moe-cuda-kernels): `rows` (the rows the
    step runs on: `T`, the batch's tokens, or `R`, its logit rows) and the
    `kernels` region with the step's exec.dispatch and exec.gemm ops, in
    launch order.
  }];
  let arguments = (ins StrAttr:$kernel, Variadic<Exec_BufferType>:$ins,
                       Variadic<Exec_WeightType>:$weights, Variadic<Exec_BufferType>:$outs,
                       DictionaryAttr:$constants, OptionalAttr<StrAttr>:$rows,
                       UnitAttr:$updates_weights);
  let regions = (region AnyRegion:$kernels);
  let assemblyFormat = [{
    $kernel (`ins` `(` $ins^ `)`)? (`weights` `(` $weights^ `)`)? (`outs` `(` $outs^ `)`)?
    (`rows` $rows^)? $constants attr-dict (`kernels` $kernels^)?
  }];
  let hasVerifier = 1;
}

def Exec_CollectiveOp : Exec_Op<"collective", [HasParent<"ProgramOp">, AttrSizedOperandSegments]> {
  let summary = "a collective over a group (mesh and axis), or a send/recv to a stage";
  let description = [{
    `kind` is one of all_reduce, all_gather, all_to_all, reduce_scatter
    (the group: `over @mesh["axis"]`) or send, recv (the peer: `stage` in
    the constants). A reduce_scatter (ZeRO-2, a train program over
    data-parallel replicas) adds rows [d k, (d + 1) k) of every member's
    gradient (its first input), k = `shard_rows`, into member d's shard
    (a state with `logical_rows`, and its error state), in member order.

    ```mlir
    exec.collective "all_reduce" over @attention["tp"] ins(%b4) outs(%b4) {}
    ```

    An all_gather of a weight (ZeRO, an optimizer program over
    data-parallel replicas) gathers it in place: member d updated rows
    [d k, (d + 1) k) of its state view (its elements as rows of its last
    dimension), k = `shard_rows`, and every member ends with the whole.

    ```mlir
    exec.collective "all_gather" over @mesh["dp"] weights(%w0) {shard_rows = 126 : i64}
    ```
  }];
  let arguments = (ins StrAttr:$kind, OptionalAttr<FlatSymbolRefAttr>:$mesh,
                       OptionalAttr<StrAttr>:$axis, Variadic<Exec_BufferType>:$ins,
                       Variadic<Exec_WeightType>:$weights,
                       Variadic<Exec_BufferType>:$outs, DictionaryAttr:$constants,
                       OptionalAttr<StrAttr>:$rows);
  let assemblyFormat = [{
    $kind (`over` $mesh^ `[` $axis `]`)? (`ins` `(` $ins^ `)`)? (`weights` `(` $weights^ `)`)?
    (`outs` `(` $outs^ `)`)? (`rows` $rows^)? $constants attr-dict
  }];
  let hasVerifier = 1;
}


//===----------------------------------------------------------------------===//
// The kernel level: what a GPU target lowers a launch to
//===----------------------------------------------------------------------===//

def Exec_DispatchOp : Exec_Op<"dispatch", [ParentOneOf<["LaunchOp", "KernelsOp"]>]> {
  let summary = "one kernel launch: grid, block and parameters";
  let description = [{
    `kernel` names a kernel of the program's exec.kernels source. Each grid
    dimension `[a, d, c]` is ceil(a * N / d) + c blocks, N the step's rows
    (`T` or `R`, or the launch's own `rows`). `params` are the kernel's
    arguments by reference, as the runtime binds them: `buf:N`, `weight:N`,
    `scratch:N`, `rope:N`, `batch:...`, `coord:...`, `const:V`, `T`, `R`,
    `null` (docs/cuda.md).

    ```mlir
    exec.dispatch "moe_s1_rms_norm" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 64
        params ["buf:2", "weight:1", "buf:3", "T"] {shared_bytes = 0 : i64}
    ```
  }];
  let arguments = (ins StrAttr:$kernel, DenseI64ArrayAttr:$grid_x, DenseI64ArrayAttr:$grid_y,
                       DenseI64ArrayAttr:$grid_z, I64Attr:$block, I64Attr:$shared_bytes,
                       StrArrayAttr:$params, OptionalAttr<StrAttr>:$rows);
  let assemblyFormat = [{
    $kernel `grid` `(` $grid_x `,` $grid_y `,` $grid_z `)` `block` $block
    `params` $params (`rows` $rows^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Exec_GemmOp : Exec_Op<"gemm", [HasParent<"LaunchOp">]> {
  let summary = "C = op(A) x op(B) by the target's BLAS (strided-batched with batch > 1)";
  let description = [{
    Row-major `c[m x n] = op(a)[m x k] * op(b)[k x n]`, `b` in `b_dtype`:
    `a` is stored `[m, k]`, or `[k, m]` with `transpose_a`; `b` is stored
    `[n, k]` with `transpose_b` (a weight `[out, in]`), else `[k, n]`.
    `accumulate` adds the product to `c` (BLAS beta = 1). `m` is `T`, `R`
    or a number; `k_rows` (`T` or `R`) makes `k` the step's rows (`k` is
    then their most), as in a weight gradient `dy^T x` summed over tokens. With `batch` > 1 the operands advance by
    their strides per block; `b_batch_modulo` makes block i use weight block
    i mod it (an expert stack shared by the blocks of several ranks) and
    `rows_from_counts` bounds each block's rows by a counts buffer.
  }];
  let arguments = (ins StrAttr:$a, StrAttr:$b, StrAttr:$c, StrAttr:$m, I64Attr:$n, I64Attr:$k,
                       I64Attr:$lda, I64Attr:$ldb, I64Attr:$ldc, StrAttr:$b_dtype,
                       BoolAttr:$transpose_b, I64Attr:$batch,
                       OptionalAttr<I64Attr>:$stride_a, OptionalAttr<I64Attr>:$stride_b,
                       OptionalAttr<I64Attr>:$stride_c, OptionalAttr<I64Attr>:$b_batch_modulo,
                       OptionalAttr<StrAttr>:$rows_from_counts, OptionalAttr<StrAttr>:$rows,
                       OptionalAttr<BoolAttr>:$transpose_a, OptionalAttr<BoolAttr>:$accumulate,
                       OptionalAttr<StrAttr>:$k_rows);
  let assemblyFormat = [{
    `(` $a `,` $b `)` `->` $c `m` $m `n` $n `k` $k (`rows` $rows^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Exec_KernelsOp : Exec_Op<"kernels", [HasParent<"ProgramOp">, NoTerminator, SingleBlock]> {
  let summary = "a program's kernels for a target: their source and shared state";
  let description = [{
    `source` is the kernels' translation unit (CUDA C++ for `cuda`), `names`
    its kernels in order, `scratch_bytes` the step-local workspaces the
    dispatches share (`scratch:N`), `rope_tables` the cos/sin tables they
    read (`rope:N`); the `sampling` region holds the greedy sampler's
    dispatch (argmax over the logit rows).
  }];
  let arguments = (ins StrAttr:$target, StrAttr:$source, StrArrayAttr:$names,
                       DenseI64ArrayAttr:$scratch_bytes, ArrayAttr:$rope_tables);
  let regions = (region AnyRegion:$sampling);
  let assemblyFormat = [{
    $target `names` $names `scratch` $scratch_bytes attr-dict-with-keyword
    (`sampling` $sampling^)?
  }];
}

#endif // MOE_DIALECT_EXEC_IR_EXECOPS_TD
