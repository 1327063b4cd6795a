//! Host access to small f32 results (logits rows, sampled distributions): borrowed from CPU
//! storage without a copy, copied from device memory.

use candle_core::{Result, Storage, Tensor};

/// Calls `f` with the tensor's elements as a contiguous f32 slice.
pub fn with_f32_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.to_dtype(candle_core::DType::F32)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    if let Storage::Cpu(cpu) = &*storage {
        let all = cpu.as_slice::<f32>()?;
        let start = layout.start_offset();
        return Ok(f(&all[start..start + t.elem_count()]));
    }
    drop(storage);
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    Ok(f(&v))
}
