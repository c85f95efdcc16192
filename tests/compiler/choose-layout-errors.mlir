// RUN: moe-opt --moe-choose-layout --split-input-file -verify-diagnostics %s

// Diagnostics of moe-choose-layout about the module, one input each. The
// planner's own (degrees the model does not divide, no layout fits, a bad
// cluster file or dtype) name the option: tests/tools/plan.test.

// expected-error @below {{expected moe.config or moe.source (the config.json the module was imported from)}}
module {
}

// -----

// expected-error @below {{expected moe.workload (run moe-specialize-workload first)}}
module attributes {moe.source = "config.json"} {
}
