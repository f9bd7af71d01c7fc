//! Access to the plugin's linear memory from inside a hostcall.

use wasmi::{Caller, Error, Extern, Memory};

use super::state::State;

/// The plugin's exported memory.
fn memory(caller: &Caller<'_, State>) -> Option<Memory> {
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => Some(m),
        _ => None,
    }
}

/// `len` bytes at `ptr`, or `None` when out of bounds.
pub(crate) fn read(caller: &Caller<'_, State>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let mem = memory(caller)?;
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    let data = mem.data(caller);
    data.get(ptr..ptr.checked_add(len)?).map(<[u8]>::to_vec)
}

/// Writes `bytes` at `ptr`; false when out of bounds.
pub(crate) fn write(caller: &mut Caller<'_, State>, ptr: i32, bytes: &[u8]) -> bool {
    match memory(caller) {
        Some(mem) => mem.write(caller, ptr as u32 as usize, bytes).is_ok(),
        None => false,
    }
}

/// Writes a little-endian u32 (a wasm32 pointer or size) at `ptr`.
pub(crate) fn write_u32(caller: &mut Caller<'_, State>, ptr: i32, v: u32) -> bool {
    write(caller, ptr, &v.to_le_bytes())
}

/// Writes a little-endian u64 at `ptr`.
pub(crate) fn write_u64(caller: &mut Caller<'_, State>, ptr: i32, v: u64) -> bool {
    write(caller, ptr, &v.to_le_bytes())
}

/// Reads a little-endian u32 at `ptr`.
pub(crate) fn read_u32(caller: &Caller<'_, State>, ptr: i32) -> Option<u32> {
    let b = read(caller, ptr, 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Copies `data` into memory the plugin allocates (its
/// `proxy_on_memory_allocate`, else `malloc`) and writes the pointer and size
/// to `ptr_ptr` / `size_ptr`. Empty data is returned as a null pointer and
/// size 0 without allocating, as Envoy does. `Ok(false)` means a bad pointer
/// or a failed allocation; `Err` is a trap inside the allocator.
pub(crate) fn give(
    caller: &mut Caller<'_, State>,
    data: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> Result<bool, Error> {
    let mut addr = 0u32;
    if !data.is_empty() {
        let Ok(size) = i32::try_from(data.len()) else {
            return Ok(false);
        };
        let alloc = ["proxy_on_memory_allocate", "malloc"]
            .iter()
            .find_map(|name| caller.get_export(name).and_then(Extern::into_func));
        let Some(alloc) = alloc else {
            caller.data_mut().violation(
                "the plugin exports neither proxy_on_memory_allocate nor malloc".to_string(),
            );
            return Ok(false);
        };
        let alloc = alloc.typed::<i32, i32>(&*caller).map_err(|e| {
            Error::new(format!(
                "proxy_on_memory_allocate has the wrong signature: {e}"
            ))
        })?;
        addr = alloc.call(&mut *caller, size)? as u32;
        if addr == 0 || !write(caller, addr as i32, data) {
            return Ok(false);
        }
    }
    Ok(write_u32(caller, ptr_ptr, addr) && write_u32(caller, size_ptr, data.len() as u32))
}
