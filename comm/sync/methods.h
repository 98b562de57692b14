// The built-in gradient-sync methods, in the order docs and errors list them: one line each. A new
// method is its file (its spec, SyncMethod <name>_method(), registry.h), one line here, and its tests.
// registry.cpp builds the table from this list, and so does the fuzz build's table
// (tests/fuzz/sync_table.cpp), which has no factories and reads each method's keys from its options
// struct (declared in the method's header).
//   X(name, options struct)
#define TRAINER_SYNC_METHODS(X)          \
  X(dense, NoOptions)              \
  X(local_sgd, LocalSgdOptions)    \
  X(diloco, DilocoOptions)         \
  X(sparseloco, SparseLocoOptions) \
  X(demo, DemoOptions)             \
  X(oktopk, OkTopkOptions)         \
  X(topka, SparseOptions)          \
  X(gaussiank, SparseOptions)      \
  X(gtopk, SparseOptions)          \
  X(powersgd, PowerSgdOptions)     \
  X(async_ps, AsyncPsOptions)
