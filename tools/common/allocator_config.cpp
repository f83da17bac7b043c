// jemalloc options read at process start. glibc malloc maps and unmaps every large
// activation each step (measured here: 16-31% of CPU time in the kernel); jemalloc that
// never returns dirty pages and keeps large allocations in its arenas turns those into
// reuse. Defaults of jemalloc were measured worse than glibc, hence the options.
// Override at run time with MALLOC_CONF as usual.
extern "C" {
__attribute__((used, visibility("default"))) const char* malloc_conf =
    "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1,background_thread:false";
}
