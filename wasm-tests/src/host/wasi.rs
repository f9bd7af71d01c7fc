//! The WASI preview 1 functions a `wasm32-wasip1` plugin imports, served as
//! Envoy serves them: stdout and stderr become log lines (info and error),
//! there are no files, no arguments and (unless scripted) no environment;
//! clocks read the scripted time and `random_get` a seeded generator.

use wasmi::{Caller, Error, Linker};

use super::abi::{errno, LogLevel, RANDOM_GET_MAX};
use super::guest::{read, read_u32, write, write_u32, write_u64};
use super::state::State;

type C<'a> = Caller<'a, State>;

const MODULE: &str = "wasi_snapshot_preview1";

fn fault_unless(ok: bool) -> i32 {
    if ok {
        errno::SUCCESS
    } else {
        errno::FAULT
    }
}

/// Defines the WASI functions the host provides; returns their names.
pub(crate) fn link(linker: &mut Linker<State>) -> Result<Vec<&'static str>, Error> {
    let mut names = Vec::new();
    macro_rules! def {
        ($($import:tt)*) => {
            define_import!(linker, names, MODULE, $($import)*)
        };
    }

    def!("fd_write", |mut c: C,
                      fd: i32,
                      iovs: i32,
                      count: i32,
                      written_ptr: i32| {
        let level = match fd {
            1 => LogLevel::Info,
            2 => LogLevel::Error,
            _ => return Ok(errno::BADF),
        };
        let mut text = Vec::new();
        for i in 0..count.max(0) {
            let at = iovs.wrapping_add(i.wrapping_mul(8));
            let (Some(buf), Some(len)) = (read_u32(&c, at), read_u32(&c, at.wrapping_add(4)))
            else {
                return Ok(errno::FAULT);
            };
            let Some(piece) = read(&c, buf as i32, len as i32) else {
                return Ok(errno::FAULT);
            };
            text.extend_from_slice(&piece);
        }
        let n = text.len() as u32;
        if text.last() == Some(&b'\n') {
            text.pop();
        }
        if !text.is_empty() {
            c.data_mut()
                .log(level, String::from_utf8_lossy(&text).into_owned());
        }
        Ok(fault_unless(write_u32(&mut c, written_ptr, n)))
    });

    def!("fd_read", |mut c: C,
                     _fd: i32,
                     _iovs: i32,
                     _count: i32,
                     _read_ptr: i32| {
        Ok(errno::NOSYS)
    });

    def!("fd_close", |mut c: C, fd: i32| {
        c.data_mut()
            .log(LogLevel::Error, format!("wasi fd_close({fd})"));
        Ok(errno::SUCCESS)
    });

    def!("fd_seek", |mut c: C,
                     fd: i32,
                     _offset: i64,
                     _whence: i32,
                     _ret: i32| {
        c.data_mut()
            .log(LogLevel::Error, format!("wasi fd_seek({fd})"));
        Ok(errno::SUCCESS)
    });

    def!("fd_fdstat_get", |mut c: C, fd: i32, ret: i32| {
        if fd != 1 && fd != 2 {
            return Ok(errno::BADF);
        }
        // A 24-byte fdstat: zero except the rights, which allow writing.
        let mut stat = [0u8; 24];
        stat[8] = 64;
        Ok(fault_unless(write(&mut c, ret, &stat)))
    });

    def!("fd_prestat_get", |mut c: C, _fd: i32, _ret: i32| {
        // No pre-opened directories.
        Ok(errno::BADF)
    });

    def!(
        "fd_prestat_dir_name",
        |mut c: C, _fd: i32, _ptr: i32, _len: i32| { Ok(errno::NOSYS) }
    );

    def!(
        "environ_sizes_get",
        |mut c: C, count_ptr: i32, size_ptr: i32| {
            let env = &c.data().env;
            let count = env.len() as u32;
            let size: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
            let ok =
                write_u32(&mut c, count_ptr, count) && write_u32(&mut c, size_ptr, size as u32);
            Ok(fault_unless(ok))
        }
    );

    def!("environ_get", |mut c: C, array: i32, buf: i32| {
        let env = c.data().env.clone();
        let (mut array, mut buf) = (array, buf);
        for (k, v) in env {
            let entry = format!("{k}={v}\0");
            if !write_u32(&mut c, array, buf as u32) || !write(&mut c, buf, entry.as_bytes()) {
                return Ok(errno::FAULT);
            }
            array = array.wrapping_add(4);
            buf = buf.wrapping_add(entry.len() as i32);
        }
        Ok(errno::SUCCESS)
    });

    def!(
        "args_sizes_get",
        |mut c: C, argc_ptr: i32, size_ptr: i32| {
            let ok = write_u32(&mut c, argc_ptr, 0) && write_u32(&mut c, size_ptr, 0);
            Ok(fault_unless(ok))
        }
    );

    def!("args_get", |mut c: C, _argv: i32, _buf: i32| {
        Ok(errno::SUCCESS)
    });

    def!("clock_time_get", |mut c: C,
                            id: i32,
                            _precision: i64,
                            ret: i32| {
        let t = match id {
            0 => c.data().now_nanos,
            1 => c.data().monotonic_nanos,
            _ => return Ok(errno::NOTSUP),
        };
        Ok(fault_unless(write_u64(&mut c, ret, t)))
    });

    def!("random_get", |mut c: C, ptr: i32, len: i32| {
        let len = len as u32;
        if len > RANDOM_GET_MAX {
            return Ok(errno::INVAL);
        }
        let mut bytes = Vec::with_capacity(len as usize + 8);
        while bytes.len() < len as usize {
            let r = c.data_mut().next_random();
            bytes.extend_from_slice(&r.to_le_bytes());
        }
        bytes.truncate(len as usize);
        Ok(fault_unless(write(&mut c, ptr, &bytes)))
    });

    def!("sched_yield", |mut c: C| { Ok(errno::SUCCESS) });

    def!("proc_exit", |mut c: C, code: i32| -> Result<(), Error> {
        // A plugin never exits; treat it as the VM dying.
        Err(Error::i32_exit(code))
    });

    Ok(names)
}
