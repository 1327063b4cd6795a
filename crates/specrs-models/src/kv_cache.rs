//! Paged KV storage: per layer one K and one V tensor of `[num_blocks * block_size,
//! kv_heads * head_dim]` rows, addressed by slot (or one tensor serving as both, for latent
//! attention's entries). Which slots belong to which sequence is bookkept by
//! `specrs_core::kv_blocks`; rolling back rejected drafts never touches this storage, it only
//! shortens the sequence's length there.

use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Result, Tensor};

use crate::config::DecoderConfig;

#[derive(Debug, Clone)]
pub struct PagedKvCache {
    layers: Vec<(Tensor, Tensor)>,
    num_blocks: usize,
    block_size: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Each layer's V is its K tensor (`Self::shared`): writes store keys only.
    values_are_keys: bool,
}

impl PagedKvCache {
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let rows = num_blocks * block_size;
        let layers = (0..num_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros((rows, kv_heads * head_dim), dtype, device)?,
                    Tensor::zeros((rows, kv_heads * head_dim), dtype, device)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, num_blocks, block_size, kv_heads, head_dim, values_are_keys: false })
    }

    /// One `[slots, head_dim]` tensor per layer read as both K and V: latent attention caches
    /// a single entry per token that its heads score against and average.
    pub fn shared(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let rows = num_blocks * block_size;
        let layers = (0..num_layers)
            .map(|_| Tensor::zeros((rows, head_dim), dtype, device).map(|kv| (kv.clone(), kv)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, num_blocks, block_size, kv_heads: 1, head_dim, values_are_keys: true })
    }

    /// The cache `num_layers` layers of `cfg`'s attention read: shared entries under latent
    /// attention, K and V otherwise.
    pub fn for_config(
        cfg: &DecoderConfig,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        match cfg.mla {
            Some(_) => Self::shared(num_layers, num_blocks, block_size, cfg.head_dim, dtype, device),
            None => Self::new(num_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype, device),
        }
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// `(K, V)` of a layer, each `[num_slots, kv_heads * head_dim]`.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Writes `k, v [T, kv_heads, head_dim]` of this step's tokens to their slots (`k` alone
    /// when the values are the keys): `slots`
    /// on the host, or `slot_tensor [T]` (u32) on the cache's device. Off the CPU a given
    /// `slot_tensor` is used as is (no upload, so the write can be captured in a device graph);
    /// on the CPU the host slots are used, read from `slot_tensor` when `slots` is empty.
    pub fn write(
        &self,
        layer: usize,
        slots: &[u32],
        slot_tensor: Option<&Tensor>,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let (kc, vc) = &self.layers[layer];
        let t = k.dim(0)?;
        let width = self.kv_heads * self.head_dim;
        let k = k.reshape((t, width))?.to_dtype(kc.dtype())?;
        let v = v.reshape((t, width))?.to_dtype(vc.dtype())?;
        if kc.device().is_cpu() {
            let from_tensor;
            let slots = match slot_tensor {
                Some(s) if slots.is_empty() => {
                    from_tensor = s.to_dtype(DType::U32)?.to_vec1::<u32>()?;
                    &from_tensor
                }
                _ => slots,
            };
            if slots.len() != t {
                candle_core::bail!("write-kv-slots: {} slots for {t} tokens", slots.len());
            }
            let op = WriteSlots { slots };
            kc.inplace_op2(&k.contiguous()?, &op)?;
            if !self.values_are_keys {
                vc.inplace_op2(&v.contiguous()?, &op)?;
            }
        } else {
            let idx = match slot_tensor {
                Some(s) => s.clone(),
                None => Tensor::from_slice(slots, t, kc.device())?,
            };
            let idx = idx.to_dtype(DType::U32)?.reshape((t, 1))?.broadcast_as((t, width))?.contiguous()?;
            kc.scatter_set(&idx, &k, 0)?;
            if !self.values_are_keys {
                vc.scatter_set(&idx, &v, 0)?;
            }
        }
        Ok(())
    }
}

/// Copies row `i` of the source into row `slots[i]` of the cache, in place.
struct WriteSlots<'a> {
    slots: &'a [u32],
}

impl InplaceOp2 for WriteSlots<'_> {
    fn name(&self) -> &'static str {
        "write-kv-slots"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dst_l: &Layout, src: &CpuStorage, src_l: &Layout) -> Result<()> {
        let width = dst_l.dims()[1];
        let dst_off = dst_l.start_offset();
        let src_off = src_l.start_offset();
        match (dst, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => copy_rows(d, dst_off, s, src_off, width, self.slots),
            (CpuStorage::F16(d), CpuStorage::F16(s)) => copy_rows(d, dst_off, s, src_off, width, self.slots),
            (CpuStorage::BF16(d), CpuStorage::BF16(s)) => copy_rows(d, dst_off, s, src_off, width, self.slots),
            _ => candle_core::bail!("write-kv-slots: cache and values must share a float dtype"),
        }
    }
}

fn copy_rows<T: Copy>(
    dst: &mut [T],
    dst_off: usize,
    src: &[T],
    src_off: usize,
    width: usize,
    slots: &[u32],
) -> Result<()> {
    let rows = (dst.len() - dst_off) / width;
    for (i, &slot) in slots.iter().enumerate() {
        let slot = slot as usize;
        if slot >= rows {
            candle_core::bail!("write-kv-slots: slot {slot} outside the cache's {rows} slots");
        }
        let s = &src[src_off + i * width..src_off + (i + 1) * width];
        dst[dst_off + slot * width..dst_off + (slot + 1) * width].copy_from_slice(s);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_in_their_slots() {
        let dev = Device::Cpu;
        let cache = PagedKvCache::new(1, 2, 4, 2, 2, DType::F32, &dev).unwrap();
        let k = Tensor::arange(0f32, 8., &dev).unwrap().reshape((2, 2, 2)).unwrap();
        let v = (&k * 10.).unwrap();
        cache.write(0, &[5, 1], None, &k, &v).unwrap();
        let (kc, vc) = cache.layer(0);
        let kc = kc.to_vec2::<f32>().unwrap();
        assert_eq!(kc[5], vec![0., 1., 2., 3.]);
        assert_eq!(kc[1], vec![4., 5., 6., 7.]);
        assert_eq!(kc[0], vec![0.; 4]);
        assert_eq!(vc.to_vec2::<f32>().unwrap()[1], vec![40., 50., 60., 70.]);
        assert!(cache.write(0, &[8], None, &k.narrow(0, 0, 1).unwrap(), &v.narrow(0, 0, 1).unwrap()).is_err());
    }

    #[test]
    fn a_shared_cache_reads_its_keys_as_values() {
        let dev = Device::Cpu;
        let cache = PagedKvCache::shared(2, 2, 4, 3, DType::F32, &dev).unwrap();
        assert_eq!((cache.kv_heads(), cache.head_dim(), cache.num_layers()), (1, 3, 2));
        let k = Tensor::arange(0f32, 6., &dev).unwrap().reshape((2, 1, 3)).unwrap();
        // Values passed alongside are not stored: V is the K tensor.
        cache.write(1, &[6, 2], None, &k, &(&k * 10.).unwrap()).unwrap();
        let (kc, vc) = cache.layer(1);
        assert_eq!(kc.to_vec2::<f32>().unwrap()[6], vec![0., 1., 2.]);
        assert_eq!(vc.to_vec2::<f32>().unwrap()[2], vec![3., 4., 5.]);
        assert_eq!(cache.layer(0).0.to_vec2::<f32>().unwrap()[6], vec![0.; 3]);
    }
}
