// moert run PLAN --weights DIR --prompt TEXT | --tokens 1,2,3 [...] [options],
// and the other commands of the moert command line.
#include "InProcessComm.h"
#include "InputFile.h"
#include "TextCli.h"
#include "TrainCli.h"
#include "moert/Cli.h"
#include "moert/Checkpoint.h"
#include "moert/Comm.h"
#include "moert/Error.h"
#include "moert/Executor.h"
#include "moert/Npy.h"
#include "moert/Parallel.h"
#include "moert/ShardedCheckpoint.h"
#include "moert/Version.h"
#include "moert/cpu/Isa.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <map>
#include <new>
#include <thread>

namespace moert {
namespace {

const char *kUsage = R"(usage: moert run PLAN --weights DIR --prompt TEXT [--prompt TEXT ...] [options]
       moert run PLAN --weights DIR --tokens IDS [--tokens IDS ...] [options]
       mpirun -np N moert run PLAN ...   (a plan of N ranks)
       moert tokenize --tokenizer PATH TEXT [TEXT ...]
       moert tokenize --tokenizer PATH --input FILE [--input FILE ...] --output PREFIX
       moert detokenize --tokenizer PATH IDS [IDS ...]
       moert train PLAN --weights DIR --data TOKENS [--micro-batches N] [--metrics-out F]
                   [--grads-out F.safetensors] [--profile] [--report-memory] [--device cpu|cuda]
                   [--steps N [--weights-out F] [--save CKPT [--save-every K]] [--resume CKPT]
                    [--shuffle-seed S]] [--tokenizer PATH]
       moert convert PLAN --weights HF_DIR --out CKPT
       moert export CKPT --hf-out DIR [--max-shard-bytes N] [--expert-layout per-expert|fused]
       moert --version

Runs a plan written by `moec compile` on the CPU and prints, per prompt, the
continuation: as text for a --prompt (streamed token by token when stdout is
a terminal and there is one prompt), as token ids (comma-separated, one line
per prompt) for --tokens or with --print-ids. A plan of N > 1
ranks runs under `mpirun -np N`: every rank loads its slices of the weights,
rank 0 prints the results and writes --logits-out.

  PLAN                  the plan file
  --weights DIR         Hugging Face checkpoint: DIR/model.safetensors, or the
                        shards of DIR/model.safetensors.index.json (F32/BF16/F16);
                        or a sharded checkpoint (DIR/manifest.json) written by
                        moert convert under any plan
  --prompt TEXT         one prompt as text, encoded with the model's tokenizer
                        (tokenizer.json of --weights, or --tokenizer); repeat
                        for a batch; special tokens are added as the tokenizer
                        says (BOS for Llama-style ones)
  --tokens 1,2,3        one prompt as comma-separated token ids; repeat for a batch
  --tokenizer PATH      a tokenizer.json, or a directory holding one (and its
                        tokenizer_config.json)
  --print-ids           print the generated ids of --prompt too, not text
  --max-new-tokens N    tokens to generate per prompt (default 16); stops early at
                        the model's EOS token unless --ignore-eos
  --ignore-eos          always generate --max-new-tokens tokens
  --logits-out F.npy    write the logits of every prompt position, all prompts in
                        order, as float32 [prompt tokens, vocab]
  --temperature T       sample with temperature T (default 0: greedy)
  --top-k K             sample among the K most likely tokens (default: all)
  --top-p P             sample within the smallest set of probability >= P (default 1)
  --seed S              seed of the sampler (default 0); same seed, same tokens
  --threads N           worker threads (default: all cores)
  --matmul-precision bf16|f32  inputs of the products with BF16 weights on the
                        CPU: bf16 (default; activations rounded to bf16 and the
                        bf16 dot instruction used, as PyTorch computes a BF16
                        matmul; only where the CPU has it, else f32) or f32
                        (exact products, the same result on every CPU);
                        also MOERT_MATMUL_PRECISION
  --in-process          run every rank of a plan of several in this process, one
                        thread each, without mpirun (or under mpirun -np P,
                        P dividing the plan's N ranks, N / P in each
                        process): the same bits as under mpirun -np N (the
                        collectives add in the same order)
  --collective-timeout S  end the job when a collective between ranks does not
                        complete within S seconds (default 300)
  --report-memory       print, per rank, the weights loaded and the peak memory
                        measured, against the plan's predictions
  --report-json FILE    write those figures and the generation's throughput as
                        JSON, for `moec report PLAN --measured FILE`
  --device cpu|cuda     where to run (default: cuda for a plan compiled with
                        moec --target cuda, else cpu); a CUDA plan also runs on
                        the CPU

`moert tokenize` prints the ids of each TEXT (--no-special: without the
special tokens the post-processor adds), or with --input writes token data
for training: PREFIX.tokens.npy (int32: each document's ids, then EOS unless
--no-eos) and PREFIX.docs.npy (int64: where each document starts, then the
total). A .jsonl input (or --jsonl-field KEY) is one document per line (its
"text" field), a text file one document (--lines: one per line); encoding
runs on --threads threads. `moert detokenize` prints the text of each
comma-separated id list (--skip-special leaves special tokens out).
docs/tokenizer.md.

`moert train` runs a training plan (moec compile --train --seq-len L
--micro-batch-size B) over TOKENS (a 1-D .npy of integer ids, such as
tokenize's PREFIX.tokens.npy, or a Megatron dataset PREFIX.bin/PREFIX.idx),
cut into windows of L + 1 tokens, B per micro-batch, and prints the loss,
cross-entropy, balancing loss and router z-loss of each of the first
--micro-batches (default 1), with the gradients' global norm; --metrics-out
writes them as JSON lines, --grads-out the gradient of the mean loss with
respect to every weight (f32, by checkpoint name), --profile the time of
each op kind per micro-batch (with --steps, and of the optimizer's per
update); --device as for run (a plan compiled with
--target cuda runs on the GPU unless --device cpu). With a plan compiled
with --optimizer adamw, --steps N trains: N updates, each over the plan's
micro-batches (--global-batch-size), printing a line per update (mean loss
terms, gradient norm, learning rate, tokens/s); --weights-out F.safetensors
writes the trained weights (f32, by checkpoint name); --save CKPT
[--save-every K] writes a training checkpoint (weights, optimizer state,
step, data position; a sharded checkpoint that run and export read) after
every K updates and the last, and --resume CKPT continues one up to update
N (--steps is the last update's number); --shuffle-seed S draws each pass's
window order from S (default: in order). A .txt or .jsonl --data (any
file with --tokenizer) is text, encoded with the model's tokenizer
(--tokenizer PATH, else the weights directory's); a JSONL file of
{"prompt", "response"} objects trains on the responses only. A plan
compiled with --dp N trains under mpirun -np N: data-parallel replicas,
each running its share of an update's micro-batches, rank 0 printing and
writing (--collective-timeout and --in-process as for run); with ZeRO (--zero 1 or 2) each
holds its shards of the optimizer's states (and of the gradient sums),
which --save gathers into one layout-free checkpoint. A plan compiled with
--tp-arithmetic runs several of its ranks in each process, as --in-process
does: without mpirun all of them, or under mpirun -np P (P dividing its
ranks), with the same bytes whatever P. docs/training.md.

`moert convert` writes the primary weight slices of every rank of PLAN, read
from HF_DIR (or from a sharded checkpoint of any plan), as a sharded
checkpoint CKPT (docs/checkpoint-format.md); under `mpirun -np N` (N = the
plan's ranks) each rank writes its own file and rank 0 the manifest, last.
`moert export` writes a sharded checkpoint back as a Hugging Face directory
(one model.safetensors, or shards of at most --max-shard-bytes, default 5 GB,
with model.safetensors.index.json), its routed experts as the checkpoint it
was converted from stored them (per-expert tensors as transformers 4.x
writes them, or 5.x's fused gate_up_proj / down_proj) unless
--expert-layout says otherwise. Convert, export and loading weights show
a progress bar when stderr is a terminal; MOERT_PROGRESS=1 prints plain lines
instead (at most one a second), MOERT_PROGRESS=0 nothing.

The CPU kernels use the best instruction-set level the CPU has (moert --version
says which); MOERT_ISA=generic|avx2|avx512|avx512bf16 forces a lower one.

Exit codes: 0 ok, 1 internal failure, 2 bad input (plan, checkpoint, option, prompt).
Under mpirun (or --in-process), an error on any rank ends the whole job (MPI_Abort with
the same status) after the rank prints it as `moert: error: rank R: ...`.
)";

} // namespace

double parseDouble(const std::string &option, const char *text) {
  char *end;
  double value = std::strtod(text, &end);
  if (end == text || *end || !std::isfinite(value))
    inputError("{}: expected a finite number but got '{}'", option, text);
  return value;
}

int64_t parseInt(const std::string &option, const char *text) {
  int64_t value;
  const char *end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end)
    inputError("{}: expected an integer but got '{}'", option, text);
  return value;
}

const char *optionValue(int argc, char **argv, int &i) {
  if (i + 1 >= argc)
    inputError("{}: expected a value", argv[i]);
  return argv[++i];
}

std::vector<int32_t> parseTokenIds(const char *text, const char *option) {
  std::vector<int32_t> ids;
  std::string list(text);
  if (list.empty())
    return ids;
  size_t at = 0;
  for (;;) {
    size_t comma = list.find(',', at);
    std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    int64_t id = parseInt(option, item.c_str());
    if (id < INT32_MIN || id > INT32_MAX)
      inputError("{}: token id {} out of range", option, id);
    ids.push_back(static_cast<int32_t>(id));
    if (comma == std::string::npos)
      break;
    at = comma + 1;
  }
  return ids;
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// --report-memory: each rank's loaded weights and measured peak (`all`:
/// pairs by rank) against the plan's predictions.
void printMemoryReport(const Plan &plan, const std::vector<int64_t> &all) {
  for (int64_t r = 0; r < static_cast<int64_t>(all.size() / 2); ++r) {
    int64_t predictedWeights = 0, predictedPeak = 0;
    if (r < static_cast<int64_t>(plan.ranks.size())) {
      predictedWeights = plan.ranks[r].predictedWeightBytes;
      predictedPeak = plan.ranks[r].predictedPeakBytes;
    }
    int64_t peak = all[2 * r + 1];
    std::string error =
        predictedPeak > 0
            ? fmt::format("{:+.1f}%", 100.0 * static_cast<double>(peak - predictedPeak) /
                                          static_cast<double>(predictedPeak))
            : std::string("n/a");
    fmt::print("rank {}: weights loaded {} bytes (plan {}), peak measured {:.2f} MiB, "
               "predicted {:.2f} MiB ({})\n",
               r, all[2 * r], predictedWeights, static_cast<double>(peak) / kMiB,
               static_cast<double>(predictedPeak) / kMiB, error);
  }
}

/// --report-json: the measured figures moec report draws (docs/plan-report.md),
/// written atomically.
void writeMeasured(const std::string &path, const std::string &planPath, const Plan &plan,
                   const std::vector<int64_t> &all, int64_t tokens, double seconds) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int64_t r = 0; r < static_cast<int64_t>(all.size() / 2); ++r)
    ranks.push_back({{"rank", r}, {"weights_loaded", all[2 * r]}, {"peak", all[2 * r + 1]}});
  nlohmann::ordered_json out = {
      {"format", "moert-measured"},
      {"version", 1},
      {"plan", planPath},
      {"world_size", plan.worldSize},
      {"ranks", std::move(ranks)},
      {"generation",
       {{"tokens", tokens},
        {"seconds", seconds},
        {"tokens_per_second", seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0}}}};
  const std::string text = out.dump(2) + "\n";
  writeFileAtomically(path, text);
}

/// `moert run`; every rank of the job runs it with the same arguments.
/// The message and exit status of a command that threw: moertMain's, and
/// each in-process rank's.
std::pair<std::string, int> failureOf(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const InputError &e) {
    return {e.what(), 2};
  } catch (const std::bad_alloc &) {
    // The plan's sizes are within moert's limits but this machine's memory
    // is not: a property of the input on this machine, not a bug.
    return {"out of memory: the plan's weights, KV caches and buffers do not fit this "
            "machine (see moec --explain and moert --report-memory; a smaller "
            "--max-seq-len, --max-sequences or --max-batch-tokens shrinks them)",
            2};
  } catch (const std::exception &e) {
    return {std::string("internal error: ") + e.what(), 1};
  }
}

} // namespace

void checkInProcess(const Comm &comm, int threads, DeviceKind device, const Plan &plan,
                    const std::string &planPath, bool asked) {
  // --in-process, or a plan whose processes run several ranks each (moec
  // compile --tp-arithmetic).
  const std::string how =
      asked ? std::string("--in-process")
            : fmt::format("{} ({} ranks a process: moec compile --tp-arithmetic)", planPath,
                          plan.ranksPerProcess);
  const int64_t ranks = plan.worldSize;
  if (ranks % comm.size())
    inputError("{} under mpirun -np {}: the plan's {} ranks do not split between {} processes",
               how, comm.size(), ranks, comm.size());
  if (comm.size() > 1 && !mpiAllowsThreads(comm))
    inputError("{} under mpirun: this MPI does not let every thread call it "
               "(MPI_THREAD_MULTIPLE)",
               how);
  if (threads != 1)
    inputError("--threads {}: {} runs each rank on one thread", threads, how);
  if (device != DeviceKind::Cpu)
    inputError("{} runs the ranks on the CPU device (--device cpu); a CUDA plan's "
               "ranks run under mpirun",
               how);
  // (The plan asked for it: say so once.)
  if (!asked && comm.rank() == 0 && ranks > comm.size())
    fmt::print("{}: {} of its {} ranks in each of {} process{}, one thread each\n", planPath,
               ranks / comm.size(), ranks, comm.size(), comm.size() > 1 ? "es" : "");
}

int runCommandInProcess(int ranks, int argc, char **argv, int (*command)(int, char **, Comm &),
                        const Comm &process) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], "--in-process") != 0)
      args.emplace_back(argv[i]);
  args.emplace_back("--threads");
  args.emplace_back("1");
  setNumThreads(1); // the ranks' loops run on their own threads
  return runRanksInProcess(ranks, [&](Comm &comm) {
    std::vector<std::string> own = args; // each rank parses its own copy
    std::vector<char *> list;
    for (std::string &a : own)
      list.push_back(a.data());
    try {
      return command(static_cast<int>(list.size()), list.data(), comm);
    } catch (const std::exception &) {
      auto [text, status] = failureOf(std::current_exception());
      comm.abort(text, status);
    }
    return 1; // (abort does not return)
  }, process.size(), process.rank());
}

namespace {

int run(int argc, char **argv, Comm &comm) {
  std::string planPath, weightsPath, logitsOut, tokenizerPath;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::pair<size_t, std::string>> texts; // prompt index, text
  bool printIds = false;
  GenerateOptions options;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double collectiveTimeout = 300;
  bool reportMemory = false, inProcess = false, threadsGiven = false;
  std::string deviceName, reportJson;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&] { return optionValue(argc, argv, i); };
    if (arg == "--weights") weightsPath = value();
    else if (arg == "--tokens") prompts.push_back(parseTokenIds(value(), "--tokens"));
    else if (arg == "--prompt") {
      texts.emplace_back(prompts.size(), value());
      prompts.emplace_back();
    }
    else if (arg == "--tokenizer") tokenizerPath = value();
    else if (arg == "--print-ids") printIds = true;
    else if (arg == "--max-new-tokens") options.maxNewTokens = parseInt(arg, value());
    else if (arg == "--ignore-eos") options.stopAtEos = false;
    else if (arg == "--logits-out") logitsOut = value();
    else if (arg == "--temperature") options.sampling.temperature = parseDouble(arg, value());
    else if (arg == "--top-k") options.sampling.topK = parseInt(arg, value());
    else if (arg == "--top-p") options.sampling.topP = parseDouble(arg, value());
    else if (arg == "--seed") options.sampling.seed = static_cast<uint64_t>(parseInt(arg, value()));
    else if (arg == "--threads") {
      threads = static_cast<int>(parseInt(arg, value()));
      threadsGiven = true;
    }
    else if (arg == "--collective-timeout") collectiveTimeout = parseDouble(arg, value());
    else if (arg == "--report-memory") reportMemory = true;
    else if (arg == "--in-process") inProcess = true;
    else if (arg == "--report-json") reportJson = value();
    else if (arg == "--device") deviceName = value();
    else if (arg == "--matmul-precision") {
      std::string name = value();
      cpu::MatmulPrecision precision;
      if (!cpu::parseMatmulPrecision(name, precision))
        inputError("--matmul-precision: expected bf16 or f32 but got '{}'", name);
      cpu::setMatmulPrecision(precision);
    }
    else if (!arg.empty() && arg[0] == '-') inputError("unknown option '{}' (see moert --help)", arg);
    else if (planPath.empty()) planPath = arg;
    else inputError("unexpected argument '{}'", arg);
  }
  if (planPath.empty())
    inputError("expected a plan (moert run PLAN --weights DIR --prompt TEXT)");
  if (weightsPath.empty())
    inputError("--weights: expected the checkpoint directory");
  if (threads < 1 || threads > 1024)
    inputError("--threads: expected a value in [1, 1024] but got {}", threads);
  if (!deviceName.empty() && deviceName != "cpu" && deviceName != "cuda")
    inputError("--device {}: expected cpu or cuda", deviceName);
  if (!(collectiveTimeout > 0) || !std::isfinite(collectiveTimeout))
    inputError("--collective-timeout: expected a number of seconds > 0");
  if (options.sampling.temperature < 0 || options.sampling.topK < 0 ||
      !(options.sampling.topP > 0 && options.sampling.topP <= 1))
    inputError("expected --temperature >= 0, --top-k >= 0 and 0 < --top-p <= 1");
  options.keepPromptLogits = !logitsOut.empty();
  if (!logitsOut.empty()) {
    // Found out now, not after the generation: the directory must take it.
    std::string dir = logitsOut.find('/') == std::string::npos
                          ? std::string(".")
                          : logitsOut.substr(0, logitsOut.rfind('/') + 1);
    if (::access(dir.c_str(), W_OK) != 0)
      inputError("--logits-out {}: cannot write into {} ({})", logitsOut, dir,
                 std::strerror(errno));
  }
  setNumThreads(threads);
  comm.setTimeout(collectiveTimeout);

  Plan plan = Plan::load(planPath);
  if (inProcess || (plan.ranksPerProcess > 1 && plan.worldSize > comm.size())) {
    checkInProcess(comm, threadsGiven ? threads : 1,
                   chooseDevice(plan, planPath, deviceName, "moec compile --target cuda"), plan,
                   planPath, inProcess);
    if (plan.worldSize > comm.size())
      return runCommandInProcess(plan.worldSize, argc, argv, run, comm);
  }
  if (plan.worldSize > 1 && comm.size() == 1)
    inputError("{} has {} ranks: run it under mpirun -np {} (or in one process: --in-process)",
               planPath, plan.worldSize, plan.worldSize);
  if (plan.worldSize != comm.size()) {
    // Every rank sees it: rank 0 says so, all end with status 2.
    if (comm.rank() == 0)
      fmt::print(stderr, "moert: error: moert run was started with {} processes but {} has {} "
                         "ranks (mpirun -np {})\n",
                 comm.size(), planPath, plan.worldSize, plan.worldSize);
    return 2;
  }
  if (plan.training)
    inputError("{}: a training plan (moec compile --train): run it with moert train", planPath);
  comm.prepare(plan);
  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(weightsPath);
  if (!checkpoint->modelType().empty() && checkpoint->modelType() != plan.modelType)
    inputError("{}/manifest.json: a checkpoint of a '{}' model, but the plan is for '{}'",
               weightsPath, checkpoint->modelType(), plan.modelType);
  std::unique_ptr<RankExecutor> device =
      RankExecutor::create(chooseDevice(plan, planPath, deviceName, "moec compile --target cuda"));
  device->prepare(plan, comm.rank(), *checkpoint, comm);
  checkNoUnexpectedTensors(plan, *checkpoint);
  std::optional<Tokenizer> tokenizer;
  if (!texts.empty()) {
    tokenizer = promptTokenizer(tokenizerPath, weightsPath, plan.vocabSize);
    for (const auto &[index, text] : texts)
      prompts[index] = tokenizer->encode(text);
  }
  // One text prompt on a terminal: its continuation is printed as it comes.
  std::optional<TextStream> stream;
  if (comm.rank() == 0 && prompts.size() == 1 && texts.size() == 1 && !printIds &&
      ::isatty(STDOUT_FILENO)) {
    stream.emplace(*tokenizer);
    options.onToken = [&](size_t, int32_t id) { stream->add(id); };
  }
  Executor executor(plan, *device, comm, comm.rank());
  const auto started = std::chrono::steady_clock::now();
  GenerateResult result = executor.generate(prompts, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (comm.rank() == 0) {
    std::vector<bool> isText(prompts.size(), false);
    for (const auto &t : texts)
      isText[t.first] = !printIds;
    for (size_t p = 0; p < result.generated.size(); ++p) {
      if (stream)
        stream->finish();
      else if (isText[p])
        fmt::print("{}\n", tokenizer->decode(result.generated[p], /*skipSpecialTokens=*/true));
      else
        fmt::print("{}\n", fmt::join(result.generated[p], ","));
    }
    if (!logitsOut.empty()) {
      int64_t rows = static_cast<int64_t>(result.promptLogits.size()) / plan.vocabSize;
      writeNpy(logitsOut, {rows, plan.vocabSize}, result.promptLogits);
    }
  }
  if (reportMemory || !reportJson.empty()) {
    // Rank 0 gathers every rank's measured figures.
    int64_t mine[2] = {device->loadedWeightBytes(), device->peakBytes()};
    std::vector<int64_t> all(2 * static_cast<size_t>(comm.size()));
    std::vector<int> world(comm.size());
    for (int r = 0; r < comm.size(); ++r)
      world[r] = r;
    comm.allGather(mine, sizeof mine, all.data(), world, "--report-memory (gathering the figures)");
    if (comm.rank() == 0 && reportMemory)
      printMemoryReport(plan, all);
    if (comm.rank() == 0 && !reportJson.empty()) {
      int64_t tokens = 0;
      for (size_t p = 0; p < prompts.size(); ++p)
        tokens += static_cast<int64_t>(prompts[p].size() + result.generated[p].size());
      writeMeasured(reportJson, planPath, plan, all, tokens, seconds);
    }
  }
  std::fflush(stdout);
  return 0;
}

/// Parses `moert COMMAND POSITIONAL --option value ...` with the given options.
std::string parseCommand(int argc, char **argv, std::map<std::string, std::string> &options) {
  std::string positional;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (options.count(arg)) {
      if (i + 1 >= argc)
        inputError("{}: expected a value", arg);
      options[arg] = argv[++i];
    } else if (!arg.empty() && arg[0] == '-') {
      inputError("unknown option '{}' (see moert --help)", arg);
    } else if (positional.empty()) {
      positional = arg;
    } else {
      inputError("unexpected argument '{}'", arg);
    }
  }
  return positional;
}

/// `moert convert`; under mpirun (-np = the plan's world size) every rank
/// writes its own file and rank 0 the manifest.
int convert(int argc, char **argv, Comm &comm) {
  std::map<std::string, std::string> options{{"--weights", ""}, {"--out", ""}};
  std::string plan = parseCommand(argc, argv, options);
  if (plan.empty() || options["--weights"].empty() || options["--out"].empty())
    inputError("expected moert convert PLAN --weights HF_DIR --out CKPT");
  convertCheckpoint(plan, options["--weights"], options["--out"], &comm);
  return 0;
}

int exportHf(int argc, char **argv) {
  std::map<std::string, std::string> options{
      {"--hf-out", ""}, {"--max-shard-bytes", "5000000000"}, {"--expert-layout", ""}};
  std::string ckpt = parseCommand(argc, argv, options);
  if (ckpt.empty() || options["--hf-out"].empty())
    inputError("expected moert export CKPT --hf-out DIR");
  int64_t maxShard = parseInt("--max-shard-bytes", options["--max-shard-bytes"].c_str());
  if (maxShard < 1)
    inputError("--max-shard-bytes: expected a value >= 1");
  exportCheckpoint(ckpt, options["--hf-out"], static_cast<uint64_t>(maxShard),
                   options["--expert-layout"]);
  return 0;
}

} // namespace

int moertMain(int argc, char **argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    fmt::print("{}", kUsage);
    return argc < 2 ? 2 : 0;
  }
  // `moert run` starts MPI first when under mpirun (createComm). An error on
  // any rank of a job of several ends the whole job with the message.
  std::unique_ptr<Comm> comm;
  try {
    const cpu::Isa isa = cpu::activeIsa(); // MOERT_ISA checked before anything runs
    cpu::requestedMatmulPrecision();        // and MOERT_MATMUL_PRECISION
    if (!std::strcmp(argv[1], "--version")) {
      std::string levels;
      for (cpu::Isa level : cpu::supportedIsas())
        levels += std::string(levels.empty() ? "" : ", ") + cpu::isaName(level);
      fmt::print("moert {}\ncpu kernels: {} (this CPU runs {}), BF16 weights times {} inputs\n",
                 version(), cpu::isaName(isa), levels, cpu::bf16Products() ? "bf16" : "f32");
      return 0;
    }
    if (!std::strcmp(argv[1], "convert")) {
      comm = createComm(&argc, &argv);
      return convert(argc, argv, *comm);
    }
    if (!std::strcmp(argv[1], "export"))
      return exportHf(argc, argv);
    if (!std::strcmp(argv[1], "tokenize"))
      return tokenizeCommand(argc, argv);
    if (!std::strcmp(argv[1], "detokenize"))
      return detokenizeCommand(argc, argv);
    // run and train: the plan, read once MPI has started, may run several
    // ranks a process (moec compile --tp-arithmetic).
    if (!std::strcmp(argv[1], "train")) {
      comm = createComm(&argc, &argv, /*rankThreads=*/true);
      return trainCommand(argc, argv, *comm);
    }
    if (std::strcmp(argv[1], "run") != 0)
      inputError("unknown command '{}' (expected run, train, convert, export, tokenize or "
                 "detokenize; see moert --help)",
                 argv[1]);
    comm = createComm(&argc, &argv, /*rankThreads=*/true);
    return run(argc, argv, *comm);
  } catch (const std::exception &) {
    auto [text, status] = failureOf(std::current_exception());
    if (comm && comm->size() > 1)
      comm->abort(text, status); // "moert: error: rank R: ...", the job's status
    fmt::print(stderr, "moert: {}{}\n", status == 1 ? "" : "error: ", text);
    return status;
  }
}

} // namespace moert
