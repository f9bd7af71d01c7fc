//! The proxy-wasm hostcalls (module `env`), behaving as Envoy 1.40's host
//! does for the parts a session plugin uses. Statuses follow the ABI v0.2.1
//! specification; where Envoy is more specific (empty values come back as a
//! null pointer, a map that is not available now is `BAD_ARGUMENT`, replace
//! drops every earlier value of the name), Envoy's behaviour is copied so
//! that a plugin which works here works there.

use wasmi::{Caller, Error, Linker};

use super::abi::{self, buffer, status, LogLevel, MapType};
use super::guest::{give, read, write_u32, write_u64};
use super::state::{lower, valid_name, valid_value, ForeignCall, HeaderOp, LocalResponse, Metric};
use super::state::{OpKind, Phase, State};

type C<'a> = Caller<'a, State>;
type R = Result<i32, Error>;

/// Defines every `env.proxy_*` function the host provides; returns their names.
pub(crate) fn link(linker: &mut Linker<State>) -> Result<Vec<&'static str>, Error> {
    let mut names = Vec::new();
    macro_rules! def {
        ($($import:tt)*) => {
            define_import!(linker, names, "env", $($import)*)
        };
    }

    def!("proxy_log", |mut c: C, level: i32, ptr: i32, len: i32| {
        let Some(level) = LogLevel::from_abi(level) else {
            return Ok(status::BAD_ARGUMENT);
        };
        let Some(msg) = read(&c, ptr, len) else {
            return Ok(status::INVALID_MEMORY_ACCESS);
        };
        c.data_mut()
            .log(level, String::from_utf8_lossy(&msg).into_owned());
        Ok(status::OK)
    });

    def!("proxy_get_log_level", |mut c: C, ret: i32| {
        let level = c.data().log_level.to_abi() as u32;
        Ok(ok_or_fault(write_u32(&mut c, ret, level)))
    });

    def!(
        "proxy_get_current_time_nanoseconds",
        |mut c: C, ret: i32| {
            let now = c.data().now_nanos;
            Ok(ok_or_fault(write_u64(&mut c, ret, now)))
        }
    );

    def!(
        "proxy_set_tick_period_milliseconds",
        |mut c: C, period: i32| {
            c.data_mut().tick_period_ms = period as u32;
            Ok(status::OK)
        }
    );

    def!(
        "proxy_get_buffer_bytes",
        |mut c: C, ty: i32, start: i32, max: i32, ptr_ptr: i32, size_ptr: i32| {
            let data = match current_buffer(c.data(), ty) {
                Ok(d) => d,
                Err(s) => return Ok(s),
            };
            // Sizes are u32 on wasm32; computed in u64 so `start + max` cannot wrap.
            let (start, max) = (start as u32 as u64, max as u32 as u64);
            let len = data.len() as u64;
            let piece = if start >= len {
                Vec::new()
            } else {
                let end = (start + max).min(len);
                data[start as usize..end as usize].to_vec()
            };
            Ok(ok_or_fault(give(&mut c, &piece, ptr_ptr, size_ptr)?))
        }
    );

    def!(
        "proxy_get_buffer_status",
        |mut c: C, ty: i32, len_ptr: i32, flags_ptr: i32| {
            let len = match current_buffer(c.data(), ty) {
                Ok(d) => d.len() as u32,
                Err(s) => return Ok(s),
            };
            Ok(ok_or_fault(
                write_u32(&mut c, len_ptr, len) && write_u32(&mut c, flags_ptr, 0),
            ))
        }
    );

    def!(
        "proxy_set_buffer_bytes",
        |mut c: C, ty: i32, _start: i32, _size: i32, _ptr: i32, _len: i32| {
            if !(0..=buffer::MAX).contains(&ty) {
                return Ok(status::BAD_ARGUMENT);
            }
            // No body buffers are scripted and configurations are read-only.
            Ok(status::NOT_FOUND)
        }
    );

    def!(
        "proxy_get_header_map_pairs",
        |mut c: C, ty: i32, ptr_ptr: i32, size_ptr: i32| {
            let Some(map) = MapType::from_abi(ty) else {
                return Ok(status::BAD_ARGUMENT);
            };
            // Envoy answers an unavailable map with an empty one, not an error.
            let pairs = c.data_mut().map(map, false).cloned().unwrap_or_default();
            let bytes = if pairs.is_empty() {
                Vec::new()
            } else {
                abi::encode_pairs(&pairs)
            };
            Ok(ok_or_fault(give(&mut c, &bytes, ptr_ptr, size_ptr)?))
        }
    );

    def!(
        "proxy_set_header_map_pairs",
        |mut c: C, ty: i32, ptr: i32, len: i32| {
            let Some(map) = MapType::from_abi(ty) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let Some(bytes) = read(&c, ptr, len) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let st = c.data_mut();
            let pairs = abi::decode_pairs(&bytes).unwrap_or_else(|| {
                // Envoy reads a malformed map as an empty one and clears the headers.
                st.violation(format!(
                    "proxy_set_header_map_pairs: malformed map for {map:?}"
                ));
                Vec::new()
            });
            for (k, v) in &pairs {
                check_header(st, map, k, v);
            }
            let Some(target) = st.map(map, true) else {
                return Ok(status::BAD_ARGUMENT);
            };
            *target = pairs.into_iter().map(|(k, v)| (lower(&k), v)).collect();
            record(st, map, OpKind::SetAll, b"", b"");
            Ok(status::OK)
        }
    );

    def!(
        "proxy_get_header_map_value",
        |mut c: C, ty: i32, kptr: i32, klen: i32, ptr_ptr: i32, size_ptr: i32| {
            let Some(map) = MapType::from_abi(ty) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let Some(key) = read(&c, kptr, klen) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let key = lower(&key);
            let st = c.data_mut();
            let in_log = st.phase == Phase::Log;
            let Some(pairs) = st.map(map, false) else {
                return Ok(if in_log {
                    status::NOT_FOUND
                } else {
                    status::BAD_ARGUMENT
                });
            };
            // Envoy returns only the first value of a repeated header.
            let Some(value) = pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
            else {
                return Ok(status::NOT_FOUND);
            };
            Ok(ok_or_fault(give(&mut c, &value, ptr_ptr, size_ptr)?))
        }
    );

    def!(
        "proxy_add_header_map_value",
        |mut c: C, ty: i32, kptr: i32, klen: i32, vptr: i32, vlen: i32| {
            change(&mut c, ty, kptr, klen, Some((vptr, vlen)), OpKind::Add)
        }
    );

    def!(
        "proxy_replace_header_map_value",
        |mut c: C, ty: i32, kptr: i32, klen: i32, vptr: i32, vlen: i32| {
            change(&mut c, ty, kptr, klen, Some((vptr, vlen)), OpKind::Replace)
        }
    );

    def!(
        "proxy_remove_header_map_value",
        |mut c: C, ty: i32, kptr: i32, klen: i32| {
            change(&mut c, ty, kptr, klen, None, OpKind::Remove)
        }
    );

    def!(
        "proxy_get_header_map_size",
        |mut c: C, ty: i32, ret: i32| {
            let Some(map) = MapType::from_abi(ty) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let Some(pairs) = c.data_mut().map(map, false) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let size: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
            Ok(ok_or_fault(write_u32(&mut c, ret, size as u32)))
        }
    );

    def!(
        "proxy_get_property",
        |mut c: C, pptr: i32, plen: i32, ptr_ptr: i32, size_ptr: i32| {
            let Some(path) = read(&c, pptr, plen) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let Some(value) = c.data().property(&path).cloned() else {
                return Ok(status::NOT_FOUND);
            };
            Ok(ok_or_fault(give(&mut c, &value, ptr_ptr, size_ptr)?))
        }
    );

    def!(
        "proxy_set_property",
        |mut c: C, pptr: i32, plen: i32, vptr: i32, vlen: i32| {
            let (Some(path), Some(value)) = (read(&c, pptr, plen), read(&c, vptr, vlen)) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let st = c.data_mut();
            let ctx = st.context();
            match st.streams.get_mut(&ctx) {
                Some(s) => {
                    s.set_properties
                        .push((abi::path_display(&path), value.clone()));
                    s.properties.insert(path, value);
                }
                None => {
                    st.properties.insert(path, value);
                }
            }
            Ok(status::OK)
        }
    );

    def!(
        "proxy_send_local_response",
        |mut c: C,
         code: i32,
         dptr: i32,
         dlen: i32,
         bptr: i32,
         blen: i32,
         hptr: i32,
         hlen: i32,
         grpc: i32| {
            let (Some(details), Some(body), Some(headers)) = (
                read(&c, dptr, dlen),
                read(&c, bptr, blen),
                read(&c, hptr, hlen),
            ) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let st = c.data_mut();
            let headers = abi::decode_pairs(&headers).unwrap_or_else(|| {
                st.violation("proxy_send_local_response: malformed header map".to_string());
                Vec::new()
            });
            for (k, v) in &headers {
                check_header(st, MapType::ResponseHeaders, k, v);
            }
            if !(100..=599).contains(&code) {
                st.violation(format!("proxy_send_local_response: status {code}"));
            }
            let ctx = st.context();
            let Some(stream) = st.streams.get_mut(&ctx) else {
                st.violation("proxy_send_local_response outside an HTTP stream".to_string());
                return Ok(status::BAD_ARGUMENT);
            };
            stream.local_response = Some(LocalResponse {
                status: code as u32,
                details: String::from_utf8_lossy(&details).into_owned(),
                body,
                headers,
                grpc_status: grpc as u32,
            });
            Ok(status::OK)
        }
    );

    def!("proxy_continue_stream", |mut c: C, ty: i32| {
        stream_op(c.data_mut(), ty, true)
    });

    def!("proxy_close_stream", |mut c: C, ty: i32| {
        stream_op(c.data_mut(), ty, false)
    });

    def!("proxy_done", |mut c: C| {
        let st = c.data_mut();
        let ctx = st.context();
        match st.streams.get_mut(&ctx) {
            Some(s) if s.pending_done => {
                s.pending_done = false;
                Ok(status::OK)
            }
            _ => Ok(status::NOT_FOUND),
        }
    });

    def!("proxy_set_effective_context", |mut c: C, id: i32| {
        let st = c.data_mut();
        let id = id as u32;
        if id == st.root_id || st.streams.contains_key(&id) {
            st.effective = id;
            Ok(status::OK)
        } else {
            Ok(status::BAD_ARGUMENT)
        }
    });

    def!(
        "proxy_call_foreign_function",
        |mut c: C, nptr: i32, nlen: i32, aptr: i32, alen: i32, rptr: i32, rsize: i32| {
            let (Some(name), Some(args)) = (read(&c, nptr, nlen), read(&c, aptr, alen)) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let name = String::from_utf8_lossy(&name).into_owned();
            let st = c.data_mut();
            st.foreign_calls.push(ForeignCall {
                name: name.clone(),
                args,
            });
            let Some(result) = st.foreign_functions.get(&name).cloned() else {
                return Ok(status::NOT_FOUND);
            };
            if rptr == 0 {
                return Ok(status::OK);
            }
            Ok(ok_or_fault(give(&mut c, &result, rptr, rsize)?))
        }
    );

    def!(
        "proxy_define_metric",
        |mut c: C, kind: i32, nptr: i32, nlen: i32, id_ptr: i32| {
            if !(0..=abi::METRIC_TYPE_MAX).contains(&kind) {
                return Ok(status::BAD_ARGUMENT);
            }
            let Some(name) = read(&c, nptr, nlen) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let name = String::from_utf8_lossy(&name).into_owned();
            let st = c.data_mut();
            let id = match st.metrics.iter().position(|m| m.name == name) {
                Some(i) => i,
                None => {
                    st.metrics.push(Metric {
                        kind,
                        name,
                        value: 0,
                    });
                    st.metrics.len() - 1
                }
            };
            // Metric ids start at 1 so that 0 never names one.
            Ok(ok_or_fault(write_u32(&mut c, id_ptr, id as u32 + 1)))
        }
    );

    def!("proxy_increment_metric", |mut c: C, id: i32, delta: i64| {
        let Some(m) = metric(c.data_mut(), id) else {
            return Ok(status::NOT_FOUND);
        };
        if m.kind == 0 && delta < 0 {
            return Ok(status::BAD_ARGUMENT);
        }
        m.value = m.value.wrapping_add_signed(delta);
        Ok(status::OK)
    });

    def!("proxy_record_metric", |mut c: C, id: i32, value: i64| {
        let Some(m) = metric(c.data_mut(), id) else {
            return Ok(status::NOT_FOUND);
        };
        m.value = value as u64;
        Ok(status::OK)
    });

    def!("proxy_get_metric", |mut c: C, id: i32, ret: i32| {
        let Some(value) = metric(c.data_mut(), id).map(|m| m.value) else {
            return Ok(status::NOT_FOUND);
        };
        Ok(ok_or_fault(write_u64(&mut c, ret, value)))
    });

    def!(
        "proxy_get_shared_data",
        |mut c: C, kptr: i32, klen: i32, ptr_ptr: i32, size_ptr: i32, cas_ptr: i32| {
            let Some(key) = read(&c, kptr, klen) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let Some((value, cas)) = c.data().shared.get(&key).cloned() else {
                return Ok(status::NOT_FOUND);
            };
            let ok = give(&mut c, &value, ptr_ptr, size_ptr)? && write_u32(&mut c, cas_ptr, cas);
            Ok(ok_or_fault(ok))
        }
    );

    def!(
        "proxy_set_shared_data",
        |mut c: C, kptr: i32, klen: i32, vptr: i32, vlen: i32, cas: i32| {
            let (Some(key), Some(value)) = (read(&c, kptr, klen), read(&c, vptr, vlen)) else {
                return Ok(status::INVALID_MEMORY_ACCESS);
            };
            let shared = &mut c.data_mut().shared;
            let current = shared.get(&key).map_or(0, |(_, cas)| *cas);
            if cas != 0 && cas as u32 != current {
                return Ok(status::CAS_MISMATCH);
            }
            shared.insert(key, (value, current.wrapping_add(1).max(1)));
            Ok(status::OK)
        }
    );

    Ok(names)
}

fn ok_or_fault(ok: bool) -> i32 {
    if ok {
        status::OK
    } else {
        status::INVALID_MEMORY_ACCESS
    }
}

/// The configuration buffer readable in the running callback.
fn current_buffer(st: &State, ty: i32) -> Result<&[u8], i32> {
    if !(0..=buffer::MAX).contains(&ty) {
        return Err(status::BAD_ARGUMENT);
    }
    match (ty, st.phase) {
        (buffer::VM_CONFIGURATION, Phase::VmStart) => Ok(&st.vm_config),
        (buffer::PLUGIN_CONFIGURATION, Phase::Configure) => Ok(&st.plugin_config),
        _ => Err(status::NOT_FOUND),
    }
}

fn metric(st: &mut State, id: i32) -> Option<&mut Metric> {
    let i = (id as u32 as usize).checked_sub(1)?;
    st.metrics.get_mut(i)
}

fn stream_op(st: &mut State, ty: i32, resume: bool) -> R {
    if !(0..=abi::STREAM_TYPE_MAX).contains(&ty) {
        return Ok(status::BAD_ARGUMENT);
    }
    let ctx = st.context();
    let Some(s) = st.streams.get_mut(&ctx) else {
        return Ok(status::NOT_FOUND);
    };
    if resume {
        s.continued.push(ty);
        match ty {
            0 => s.request_paused = false,
            1 => s.response_paused = false,
            _ => {}
        }
    } else {
        s.closed.push(ty);
    }
    Ok(status::OK)
}

fn check_header(st: &mut State, map: MapType, k: &[u8], v: &[u8]) {
    if !valid_name(k) {
        st.violation(format!(
            "{map:?}: invalid header name {:?}",
            String::from_utf8_lossy(k)
        ));
    }
    if !valid_value(v) {
        st.violation(format!(
            "{map:?}: header {:?} set to a value with NUL, CR or LF: {:?}",
            String::from_utf8_lossy(k),
            String::from_utf8_lossy(v)
        ));
    }
}

fn record(st: &mut State, map: MapType, kind: OpKind, name: &[u8], value: &[u8]) {
    let ctx = st.context();
    if let Some(s) = st.streams.get_mut(&ctx) {
        s.ops.push(HeaderOp {
            map,
            kind,
            name: String::from_utf8_lossy(name).into_owned(),
            value: value.to_vec(),
        });
    }
}

/// Add, replace or remove one header.
fn change(c: &mut C, ty: i32, kptr: i32, klen: i32, value: Option<(i32, i32)>, kind: OpKind) -> R {
    let Some(map) = MapType::from_abi(ty) else {
        return Ok(status::BAD_ARGUMENT);
    };
    let Some(key) = read(c, kptr, klen) else {
        return Ok(status::INVALID_MEMORY_ACCESS);
    };
    let value = match value {
        Some((p, l)) => match read(c, p, l) {
            Some(v) => v,
            None => return Ok(status::INVALID_MEMORY_ACCESS),
        },
        None => Vec::new(),
    };
    let st = c.data_mut();
    if kind != OpKind::Remove {
        check_header(st, map, &key, &value);
    }
    let name = lower(&key);
    let Some(pairs) = st.map(map, true) else {
        return Ok(status::BAD_ARGUMENT);
    };
    match kind {
        OpKind::Add => pairs.push((name, value.clone())),
        OpKind::Replace => {
            // Envoy 1.40 removes every value of the name, then appends one.
            pairs.retain(|(k, _)| *k != name);
            pairs.push((name, value.clone()));
        }
        OpKind::Remove => pairs.retain(|(k, _)| *k != name),
        OpKind::SetAll => {}
    }
    record(st, map, kind, &key, &value);
    Ok(status::OK)
}
