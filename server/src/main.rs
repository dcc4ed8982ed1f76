//! The `cairn` binary: an etcd-compatible member (`cairn [flags]`, or `cairn --config-file`),
//! and the offline snapshot tools (`cairn snapshot restore|status`). See `cairn --help`.
//! Started under the name `etcd` (a symlink or a copy), it keeps etcd's defaults where they
//! differ from cairn's (`cairn_server::config::Invocation`).

/// The allocator: jemalloc, with its sampling heap profiler built in but not sampling until
/// `--enable-pprof` turns it on at startup (`cairn_server::api::pprof::start_heap_sampling`), so
/// that a member without the flag takes no stacks. It then samples an allocation every 2^19
/// bytes (512 KiB) on average, as Go's runtime does (`runtime.MemProfileRate`).
/// `_RJEM_MALLOC_CONF` in the environment overrides these options (`prof:false` for none).
///
/// Not on musl (the static builds): there jemalloc's build finds no `_Unwind_Backtrace` it
/// can link (GCC's `libgcc_eh` wants glibc's `_dl_find_object`) and falls back to walking
/// frame pointers, which Rust's code does not keep, and the first sample crashes the process
/// (tikv/jemallocator#146). The profiler stays off there, and must not be turned on.
mod allocator {
    #[global_allocator]
    static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    /// jemalloc's `malloc_conf`, under the prefix tikv-jemalloc-sys builds it with: a C
    /// `const char *` to options it reads once, at its first allocation.
    // Exporting a symbol by name is unsafe (it could clash with another of that name). It
    // does not: jemalloc's own `_rjem_malloc_conf` is weak, defined so that a program can
    // override it, and nothing else defines it. `&[u8; N]` is a thin pointer, laid out as C's
    // `const char *`, to bytes that end in NUL and are never written.
    #[cfg(target_env = "gnu")]
    #[allow(unsafe_code)]
    #[export_name = "_rjem_malloc_conf"]
    static MALLOC_CONF: &[u8; 46] = b"prof:true,prof_active:false,lg_prof_sample:19\0";
}

fn main() -> std::process::ExitCode {
    cairn_server::run_command_line()
}
