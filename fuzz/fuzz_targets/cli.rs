//! The command line (`cli/mod.rs`): arbitrary argument vectors (NUL-separated in the input, not UTF-8 where the
//! fuzzer says so) must parse or be refused with an error, never panic; a parsed configuration keeps the rules
//! the parser enforces. Go durations (`parse_go_duration`) are fuzzed with each argument.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use libfuzzer_sys::fuzz_target;
use proxy::cli::parse_go_duration;
use proxy::fuzzing::parse_cli;

fuzz_target!(|data: &[u8]| {
    let [mode, rest @ ..] = data else {
        return;
    };
    let mut args = vec![OsString::from("etcd-grpc-proxy")];
    // Bit 0: the subcommand comes first, so the fuzzer need not find it to reach the flags.
    if mode & 1 == 1 {
        args.push("start".into());
    }
    for arg in rest.split(|&b| b == 0) {
        // --password-file reads the file named: not device files, which may never end.
        if arg
            .windows(4)
            .any(|w| w == b"dev/" || w == b"proc" || w == b"sys/")
        {
            return;
        }
        if let Ok(text) = std::str::from_utf8(arg)
            && let Ok(duration) = parse_go_duration(text)
        {
            assert!(!text.is_empty());
            assert!(duration.as_secs_f64().is_finite());
        }
        args.push(OsString::from_vec(arg.to_vec()));
    }
    if let Ok(cli) = parse_cli(args) {
        let config = &cli.config;
        assert!(!config.endpoints.is_empty() || cli.srv.is_some());
        assert!(config.max_send_bytes > 0 && config.max_send_bytes <= config.max_recv_bytes);
        assert!(!config.dial_timeout.is_zero());
        assert!(config.watch_buffer_size > 0 && config.max_client_calls > 0);
    }
});
