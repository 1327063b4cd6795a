//! GGUF weights repacked at load time into tiles of 16 rows: `x [m, k] · wᵀ` with 16 output
//! columns per instruction on AVX-512 VNNI, 8 on AVX2, instead of one.
//!
//! [`crate::skinny_quant`] reads the GGUF blocks as stored (one weight row after another), so
//! each `vpdpbusd` yields partial sums of a single output, which must be converted, scaled and
//! accumulated per block and per activation row: ~4 vector instructions per 64 products. That
//! is cheap next to a weight read at m = 1 but makes every extra verified token cost ~20% of a
//! decoding step. Here the blocks of 16 consecutive weight rows (a *tile*) are interleaved so
//! that lane `c` of a register holds 4 quants of row `c`: one `vpdpbusd` against 4 activation
//! bytes broadcast to every lane advances 16 dot products, 8 of them finish a 32-value block of
//! 16 outputs as exact i32 sums, and one convert plus two multiply-adds scale it. About 11
//! instructions per 512 products per activation row, a third of the row-major kernel's.
//!
//! Layout of a tile, block `b` after block `b`, each as many bytes as 16 GGUF blocks (nothing is
//! added to the stream that decoding reads):
//! - Q8_0 (544 bytes): 16 f16 scales, then 8 groups of `[16 rows][4 quants]`, quants stored as
//!   `q + 128` (the unsigned operand of `vpdpbusd`).
//! - Q4_0 (288 bytes): 16 f16 scales, then 4 registers of `[16 rows][4 bytes]` whose low
//!   nibbles are group `i` and high nibbles group `i + 4` (quants `0..=15`, value `d · (q - 8)`).
//! - Q4_1 (320 bytes): 16 f16 scales, 16 f16 offsets `m`, then the nibbles as Q4_0 (value
//!   `d · q + m`).
//!
//! Activations are quantized per 32 values exactly as in `skinny_quant` (candle's Q8_0), and
//! stay signed: they are the broadcast operand. The unsigned storage of the weights shifts each
//! block's dot product by `c · Σq_x` (`c` = 128 for Q8_0, 8 for Q4_0), which starts the block's
//! i32 accumulator instead of costing an instruction; Q4_1's offsets add `m_w · d_x · Σq_x`.
//! Each output is summed over its blocks in order, the same whatever `m` is and whichever other
//! rows share the call, so verification stays bit-identical to plain decoding.
//!
//! CPUs without VNNI (AVX2 only, e.g. AMD Zen 3) take each tile as two halves of 8 columns, one
//! 256-bit register each: `vpmaddubsw` multiplies a group of 4 quants of 8 columns by the
//! broadcast activation bytes into i16 pair sums, which a block's 8 groups add up in i16 (Q4
//! nibbles keep that exact) before one `vpmaddwd` widens them to i32. The block is then scaled
//! with the very operations of the VNNI kernel, so both give the same bits. Against the
//! row-major AVX2 kernel this shares each block's unpacking and scale conversion among 8
//! columns: the SmolLM2 Q4_1 forward went from ~12 to ~7 ms at m = 1 on a 2-core Zen 3.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};

/// ColumnOutput columns (weight rows) per tile: the 16 i32 lanes of a 512-bit register.
pub const TILE: usize = 16;

/// Values per quantization block.
const QK: usize = 32;

/// A GGUF weight `[n, k]` in the tiled layout; see the module docs.
#[derive(Debug)]
pub struct PackedQ {
    dtype: GgmlDType,
    n: usize,
    k: usize,
    /// `ceil(n / 16)` tiles of `k / 32` tile blocks.
    bytes: Vec<u8>,
}

impl PackedQ {
    /// Repacks `w` when this CPU runs the kernels (AVX-512 F/BW and VNNI), `w` is on the CPU
    /// and in Q8_0, Q4_0 or Q4_1; `None` otherwise (the caller keeps the GGUF layout).
    pub fn pack(w: &QTensor) -> Result<Option<Self>> {
        if !cpu_supported() || !w.device().is_cpu() || !Self::serves(w.dtype()) {
            return Ok(None);
        }
        let (n, k) = w.shape().dims2()?;
        if n == 0 || k == 0 || !k.is_multiple_of(QK) {
            return Ok(None);
        }
        let data = w.data()?;
        Ok(Some(Self::pack_bytes(w.dtype(), n, k, &data)?))
    }

    /// Whether the layout holds weights of `dtype`.
    pub fn serves(dtype: GgmlDType) -> bool {
        matches!(dtype, GgmlDType::Q8_0 | GgmlDType::Q4_0 | GgmlDType::Q4_1)
    }

    fn pack_bytes(dtype: GgmlDType, n: usize, k: usize, data: &[u8]) -> Result<Self> {
        let format = Format::of(dtype).expect("served dtype");
        let blocks = k / QK;
        let src_block = format.gguf_block_bytes();
        if data.len() != n * blocks * src_block {
            candle_core::bail!(
                "{dtype:?} weight {n}x{k} holds {} bytes, expected {}",
                data.len(),
                n * blocks * src_block
            );
        }
        let tiles = n.div_ceil(TILE);
        let tile_block = format.tile_block_bytes();
        let mut bytes = vec![0u8; tiles * blocks * tile_block];
        for (i, dst) in bytes.chunks_exact_mut(tile_block).enumerate() {
            let (t, b) = (i / blocks, i % blocks);
            for c in 0..TILE {
                let row = t * TILE + c;
                let block = (row < n).then(|| &data[(row * blocks + b) * src_block..][..src_block]);
                format.pack_column(block, c, dst);
            }
        }
        Ok(Self { dtype, n, k, bytes })
    }

    /// The parts stacked along the output dim (one weight for q/k/v or gate/up): their tiles
    /// back to back. `None` unless they share dtype and `k` and every part but the last fills
    /// whole tiles.
    pub fn concat_rows(parts: &[&Self]) -> Option<Self> {
        let first = parts.first()?;
        let fits = parts.iter().all(|p| p.dtype == first.dtype && p.k == first.k)
            && parts[..parts.len() - 1].iter().all(|p| p.n.is_multiple_of(TILE));
        fits.then(|| Self {
            dtype: first.dtype,
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            bytes: parts.iter().flat_map(|p| p.bytes.iter().copied()).collect(),
        })
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// `(n, k)`: output and input widths.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    pub fn size_in_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Weight row `row` dequantized into `out` (`k` values), exactly as candle dequantizes it.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let format = Format::of(self.dtype).expect("packed dtype");
        let blocks = self.k / QK;
        let (t, c) = (row / TILE, row % TILE);
        for (b, out) in out.chunks_exact_mut(QK).enumerate() {
            let tb = &self.bytes[(t * blocks + b) * format.tile_block_bytes()..][..format.tile_block_bytes()];
            format.dequantize_column(tb, c, out.try_into().expect("32 values"));
        }
    }

    /// The whole weight as `[n, k]` f32.
    pub fn dequantize(&self) -> Result<Tensor> {
        self.dequantize_rows(&(0..self.n as u32).collect::<Vec<_>>())
    }

    /// Rows `ids` as `[ids.len(), k]` f32 (an embedding lookup).
    pub fn dequantize_rows(&self, ids: &[u32]) -> Result<Tensor> {
        let mut out = vec![0f32; ids.len() * self.k];
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(self.k)) {
            if id as usize >= self.n {
                candle_core::bail!("row {id} of a {}-row weight", self.n);
            }
            self.dequantize_row(id as usize, dst);
        }
        Tensor::from_vec(out, (ids.len(), self.k), &candle_core::Device::Cpu)
    }

    /// `x [m, k] · wᵀ -> [m, n]` for f32 `x` on the CPU; `None` for other operands.
    pub fn matmul_t(&self, x: &Tensor) -> Result<Option<Tensor>> {
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
        return x86::matmul_t(self, x, x86::Isa::detect());
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )))]
        {
            let _ = x;
            Ok(None)
        }
    }
}

/// Whether this build runs the packed kernels: x86-64-v3 or later, whose AVX2 kernels every such
/// CPU runs (and AVX-512 VNNI ones, picked at run time, where the CPU has them).
pub fn cpu_supported() -> bool {
    cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Q8_0,
    Q4_0,
    Q4_1,
}

fn f16_at(bytes: &[u8], at: usize) -> half::f16 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]])
}

impl Format {
    fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q8_0 => Some(Self::Q8_0),
            GgmlDType::Q4_0 => Some(Self::Q4_0),
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            _ => None,
        }
    }

    fn gguf_block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
        }
    }

    fn tile_block_bytes(self) -> usize {
        TILE * self.gguf_block_bytes()
    }

    /// Where the quants start in a tile block (after the scales, and the offsets of Q4_1).
    fn quants_at(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q4_0 => 2 * TILE,
            Self::Q4_1 => 4 * TILE,
        }
    }

    /// The 32 quants of a GGUF block as stored unsigned in the tiled layout, and its scale and
    /// offset bytes.
    fn unpack_gguf(self, block: &[u8]) -> ([u8; QK], [u8; 2], [u8; 2]) {
        let mut q = [0u8; QK];
        match self {
            // i8 → i8 + 128.
            Self::Q8_0 => q.iter_mut().zip(&block[2..34]).for_each(|(q, &v)| *q = v ^ 0x80),
            // Element j in the low nibble of byte j, element j + 16 in its high nibble.
            Self::Q4_0 | Self::Q4_1 => {
                let qs = &block[self.gguf_block_bytes() - 16..];
                for j in 0..16 {
                    q[j] = qs[j] & 0x0F;
                    q[j + 16] = qs[j] >> 4;
                }
            }
        }
        let m = if self == Self::Q4_1 { [block[2], block[3]] } else { [0, 0] };
        (q, [block[0], block[1]], m)
    }

    /// Writes column `c` of a tile block from a GGUF block; `None` pads with zero weights.
    fn pack_column(self, block: Option<&[u8]>, c: usize, dst: &mut [u8]) {
        let zero_quant = match self {
            Self::Q8_0 => 0x80,
            Self::Q4_0 => 8,
            Self::Q4_1 => 0,
        };
        let (q, d, m) = match block {
            Some(block) => self.unpack_gguf(block),
            None => ([zero_quant; QK], [0, 0], [0, 0]),
        };
        dst[2 * c..2 * c + 2].copy_from_slice(&d);
        if self == Self::Q4_1 {
            dst[2 * TILE + 2 * c..][..2].copy_from_slice(&m);
        }
        let quants = &mut dst[self.quants_at()..];
        for g in 0..QK / 4 {
            for j in 0..4 {
                let v = q[4 * g + j];
                match self {
                    Self::Q8_0 => quants[g * 64 + c * 4 + j] = v,
                    // Group g < 4 in the low nibbles of register g, group g + 4 in its high ones.
                    Self::Q4_0 | Self::Q4_1 => quants[(g % 4) * 64 + c * 4 + j] |= v << (4 * (g / 4)),
                }
            }
        }
    }

    /// Column `c` of a tile block as the 32 values candle dequantizes the GGUF block to.
    fn dequantize_column(self, tb: &[u8], c: usize, out: &mut [f32; QK]) {
        let d = f16_at(tb, 2 * c).to_f32();
        let quants = &tb[self.quants_at()..];
        for (g, out) in out.chunks_exact_mut(4).enumerate() {
            for (j, out) in out.iter_mut().enumerate() {
                *out = match self {
                    Self::Q8_0 => ((quants[g * 64 + c * 4 + j] ^ 0x80) as i8) as f32 * d,
                    Self::Q4_0 | Self::Q4_1 => {
                        let q = (quants[(g % 4) * 64 + c * 4 + j] >> (4 * (g / 4))) & 0x0F;
                        if self == Self::Q4_0 {
                            (q as i32 - 8) as f32 * d
                        } else {
                            q as f32 * d + f16_at(tb, 2 * TILE + 2 * c).to_f32()
                        }
                    }
                };
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
mod x86 {
    use std::arch::x86_64::*;

    use candle_core::{CpuStorage, DType, Result, Storage, Tensor};
    use rayon::prelude::*;

    use super::{Format, PackedQ, QK, TILE};
    use crate::compute::ColumnOutput;

    /// Activation rows per register tile: each unpacked weight block feeds this many rows.
    const ROWS: usize = 8;

    /// How far ahead of the tile block being multiplied the weight stream is prefetched.
    const PREFETCH_BYTES: usize = 2048;

    /// Weight bytes per parallel task (as in `skinny_quant`).
    const TASK_BYTES: usize = 48 * 1024;

    /// Activation rows quantized per 32 values (candle's Q8_0, signed): `qs [m, k]`, and per
    /// row and block (`[m, k / 32]`) the scale `d`, the i32 accumulator start `-c · Σq` of the
    /// weights' unsigned storage, and `d · Σq` for Q4_1's offsets.
    struct Activations {
        k: usize,
        qs: Vec<u8>,
        d: Vec<f32>,
        start: Vec<i32>,
        ds: Vec<f32>,
    }

    impl Activations {
        fn quantize(x: &[f32], k: usize, format: Format) -> Self {
            let blocks_total = x.len() / QK;
            let mut qs = vec![0u8; x.len()];
            let mut d = vec![0f32; blocks_total];
            let mut start = vec![0i32; blocks_total];
            let mut ds = vec![0f32; blocks_total];
            let shift = match format {
                Format::Q8_0 => 128,
                Format::Q4_0 => 8,
                Format::Q4_1 => 0,
            };
            for (i, (src, dst)) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).enumerate() {
                let dst: &mut [u8; QK] = dst.try_into().expect("32 bytes");
                let d_x = crate::skinny_quant::quantize_block(src.try_into().expect("32 values"), dst);
                let sum: i32 = dst.iter().map(|&q| i32::from(q as i8)).sum();
                d[i] = d_x;
                start[i] = -shift * sum;
                ds[i] = d_x * sum as f32;
            }
            Self { k, qs, d, start, ds }
        }
    }

    /// The kernels a call runs: `vpmaddubsw` on 8 columns per 256-bit register (every
    /// x86-64-v3 CPU) or `vpdpbusd` on 16 columns per 512-bit register.
    pub(super) use crate::simd::Isa;

    pub(super) fn matmul_t(w: &PackedQ, x: &Tensor, isa: Isa) -> Result<Option<Tensor>> {
        if !x.device().is_cpu() || x.dtype() != DType::F32 || x.rank() != 2 {
            return Ok(None);
        }
        let (m, k) = x.dims2()?;
        if k != w.k {
            candle_core::bail!("packed matmul: x has {k} columns, the weight {}", w.k);
        }
        if m == 0 {
            return Ok(Some(Tensor::zeros((0, w.n), DType::F32, x.device())?));
        }
        let format = Format::of(w.dtype).expect("packed dtype");
        let x = x.contiguous()?;
        let acts = {
            let (storage, layout) = x.storage_and_layout();
            let Storage::Cpu(CpuStorage::F32(xs)) = &*storage else {
                return Ok(None);
            };
            Activations::quantize(&xs[layout.start_offset()..][..m * k], k, format)
        };
        let blocks = k / QK;
        let tile_bytes = blocks * format.tile_block_bytes();
        let tiles = w.n.div_ceil(TILE);
        let tiles_per_task = (TASK_BYTES / tile_bytes).clamp(1, tiles);
        let mut out = vec![0f32; m * w.n];
        let out_ptr = ColumnOutput { ptr: out.as_mut_ptr(), n: w.n };
        let run = |task: usize| {
            let tiles = task * tiles_per_task..tiles.min((task + 1) * tiles_per_task);
            // SAFETY: this module is compiled for x86-64-v3 (AVX2) and `Isa::Avx512Vnni` exists
            // only on CPUs that run it; the tiles lie in `w.bytes`, `acts` holds m rows of `k`
            // values, and this task alone writes the columns of its tiles.
            unsafe {
                match (isa, format) {
                    (Isa::Avx2, Format::Q8_0) => tiles_avx2::<Q8_0>(w, &acts, m, tiles, out_ptr),
                    (Isa::Avx2, Format::Q4_0) => tiles_avx2::<Q4_0>(w, &acts, m, tiles, out_ptr),
                    (Isa::Avx2, Format::Q4_1) => tiles_avx2::<Q4_1>(w, &acts, m, tiles, out_ptr),
                    (Isa::Avx512Vnni, Format::Q8_0) => tiles_vnni::<Q8_0>(w, &acts, m, tiles, out_ptr),
                    (Isa::Avx512Vnni, Format::Q4_0) => tiles_vnni::<Q4_0>(w, &acts, m, tiles, out_ptr),
                    (Isa::Avx512Vnni, Format::Q4_1) => tiles_vnni::<Q4_1>(w, &acts, m, tiles, out_ptr),
                }
            }
        };
        (0..tiles.div_ceil(tiles_per_task)).into_par_iter().for_each(run);
        Ok(Some(Tensor::from_vec(out, (m, w.n), x.device())?))
    }

    /// A tile-block format: how its 32 quants of 16 rows become 8 registers of unsigned bytes.
    trait TileBlock {
        const BYTES: usize;
        const QUANTS_AT: usize;
        const HAS_OFFSET: bool = false;

        /// # Safety
        /// `p` points to the quants of a tile block; AVX-512 F/BW are available.
        unsafe fn unpack(p: *const u8) -> [__m512i; 8];
    }

    struct Q8_0;
    struct Q4_0;
    struct Q4_1;

    impl TileBlock for Q8_0 {
        const BYTES: usize = 16 * 34;
        const QUANTS_AT: usize = 2 * TILE;

        #[inline(always)]
        unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
            // SAFETY: 8 registers of quants follow (512 bytes).
            unsafe { std::array::from_fn(|g| _mm512_loadu_si512(p.add(g * 64).cast())) }
        }
    }

    /// Four registers of nibbles: low nibbles are groups 0..4, high nibbles groups 4..8.
    #[inline(always)]
    unsafe fn unpack_nibbles(p: *const u8) -> [__m512i; 8] {
        // SAFETY: 4 registers of quants follow (256 bytes); AVX-512 BW is available.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let v: [__m512i; 4] = std::array::from_fn(|i| _mm512_loadu_si512(p.add(i * 64).cast()));
            std::array::from_fn(|g| {
                if g < 4 {
                    _mm512_and_si512(v[g], low)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v[g - 4]), low)
                }
            })
        }
    }

    impl TileBlock for Q4_0 {
        const BYTES: usize = 16 * 18;
        const QUANTS_AT: usize = 2 * TILE;

        #[inline(always)]
        unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
            // SAFETY: forwarded.
            unsafe { unpack_nibbles(p) }
        }
    }

    impl TileBlock for Q4_1 {
        const BYTES: usize = 16 * 20;
        const QUANTS_AT: usize = 4 * TILE;
        const HAS_OFFSET: bool = true;

        #[inline(always)]
        unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
            // SAFETY: forwarded.
            unsafe { unpack_nibbles(p) }
        }
    }

    /// Columns per 256-bit register: half a tile.
    const HALF: usize = TILE / 2;

    /// Activation rows per AVX2 register tile: their accumulators and the 8 registers of an
    /// unpacked half tile block fill the 16 ymm registers.
    const AVX2_ROWS: usize = 4;

    /// How the AVX2 kernels multiply half a tile block (8 columns, 8 groups of 4 quants each) by
    /// one activation block. `vpmaddubsw` sums pairs of byte products into saturating i16
    /// lanes, so the unsigned operand must keep those pairs in range: nibbles (`0..=15`) do, and
    /// 8 groups of them still fit one i16 lane before a `vpmaddwd` widens them; Q8_0's stored
    /// `q + 128` does not, so its quants are signed again and multiplied with the sign trick.
    trait Avx2Block: TileBlock {
        /// The half's quants as the dot products want them, shared by every activation row.
        type Half: Copy;

        /// Whether [`Self::dot`] still needs the activation's start term `-c · Σq_x`, which
        /// undoes the unsigned storage: Q4_0's nibbles sit 8 above their values, while Q8_0's
        /// quants are made signed again here and Q4_1's nibbles are their values (start 0).
        const NEEDS_START: bool;

        /// # Safety
        /// `p` points to the quants of a tile block; AVX2 is available.
        unsafe fn load_half(p: *const u8, half: usize) -> Self::Half;

        /// Per column (lane), the exact i32 dot product of its 32 quants with the activation
        /// block at `x` (32 signed bytes), as stored (before the start term).
        ///
        /// # Safety
        /// `x` points to 32 readable bytes; AVX2 is available.
        unsafe fn dot(w: &Self::Half, x: *const u8) -> __m256i;
    }

    /// Group `g` (4 bytes) of an activation block in every lane.
    #[inline(always)]
    unsafe fn broadcast_group(x: *const u8, g: usize) -> __m256i {
        // SAFETY: the caller guarantees the block's 32 bytes.
        unsafe { _mm256_set1_epi32(x.add(4 * g).cast::<i32>().read_unaligned()) }
    }

    /// The 8 nibble groups of half a Q4 tile block: low nibbles of register `i` are group `i`,
    /// high nibbles group `i + 4`.
    #[inline(always)]
    unsafe fn nibble_half(p: *const u8, half: usize) -> [__m256i; 8] {
        // SAFETY: 4 registers of 64 bytes follow `p`; AVX2 is available.
        unsafe {
            let low = _mm256_set1_epi8(0x0F);
            let v: [__m256i; 4] = std::array::from_fn(|i| _mm256_loadu_si256(p.add(i * 64 + half * 32).cast()));
            std::array::from_fn(|g| {
                if g < 4 {
                    _mm256_and_si256(v[g], low)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v[g - 4]), low)
                }
            })
        }
    }

    /// `Σ_g maddubs(w_g, x_g)` in i16 lanes (each pair at most 2 · 15 · 127, 8 groups at most
    /// 30480), widened to one i32 per column.
    #[inline(always)]
    unsafe fn nibble_dot(w: &[__m256i; 8], x: *const u8) -> __m256i {
        // SAFETY: forwarded from the caller.
        unsafe {
            let mut pairs = _mm256_setzero_si256();
            for (g, &w_g) in w.iter().enumerate() {
                pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w_g, broadcast_group(x, g)));
            }
            _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
        }
    }

    impl Avx2Block for Q8_0 {
        /// Per group, the signed quants and their absolute values.
        type Half = ([__m256i; 8], [__m256i; 8]);
        const NEEDS_START: bool = false;

        #[inline(always)]
        unsafe fn load_half(p: *const u8, half: usize) -> Self::Half {
            // SAFETY: 8 registers of 64 bytes follow `p`; AVX2 is available.
            unsafe {
                let signed: [__m256i; 8] = std::array::from_fn(|g| {
                    _mm256_xor_si256(_mm256_loadu_si256(p.add(g * 64 + half * 32).cast()), _mm256_set1_epi8(i8::MIN))
                });
                (signed, signed.map(|w| _mm256_abs_epi8(w)))
            }
        }

        #[inline(always)]
        unsafe fn dot((signed, abs): &Self::Half, x: *const u8) -> __m256i {
            // SAFETY: forwarded from the caller. `|w| · sign(x, w)` pairs stay within
            // 2 · 128 · 127, so each group widens to i32 before the next is added.
            unsafe {
                let ones = _mm256_set1_epi16(1);
                let mut sum = _mm256_setzero_si256();
                for g in 0..8 {
                    let products = _mm256_maddubs_epi16(abs[g], _mm256_sign_epi8(broadcast_group(x, g), signed[g]));
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(products, ones));
                }
                sum
            }
        }
    }

    impl Avx2Block for Q4_0 {
        type Half = [__m256i; 8];
        const NEEDS_START: bool = true;

        #[inline(always)]
        unsafe fn load_half(p: *const u8, half: usize) -> Self::Half {
            // SAFETY: forwarded.
            unsafe { nibble_half(p, half) }
        }

        #[inline(always)]
        unsafe fn dot(w: &Self::Half, x: *const u8) -> __m256i {
            // SAFETY: forwarded.
            unsafe { nibble_dot(w, x) }
        }
    }

    impl Avx2Block for Q4_1 {
        type Half = [__m256i; 8];
        const NEEDS_START: bool = false;

        #[inline(always)]
        unsafe fn load_half(p: *const u8, half: usize) -> Self::Half {
            // SAFETY: forwarded.
            unsafe { nibble_half(p, half) }
        }

        #[inline(always)]
        unsafe fn dot(w: &Self::Half, x: *const u8) -> __m256i {
            // SAFETY: forwarded.
            unsafe { nibble_dot(w, x) }
        }
    }

    /// Every activation row against the tiles `tiles`, `AVX2_ROWS` rows at a time.
    ///
    /// # Safety
    /// `tiles` lie within `w`, `acts` holds `m` rows of `w.k` values, and no other thread
    /// writes the columns of `tiles`.
    unsafe fn tiles_avx2<B: Avx2Block>(
        w: &PackedQ,
        acts: &Activations,
        m: usize,
        tiles: std::ops::Range<usize>,
        out: ColumnOutput,
    ) {
        let blocks = w.k / QK;
        assert!(tiles.end * blocks * B::BYTES <= w.bytes.len() && acts.qs.len() == m * acts.k);
        for t in tiles {
            let valid = (w.n - t * TILE).min(TILE);
            // SAFETY: tile `t` lies within `w.bytes` (asserted above); each call covers rows
            // `row..row + R` with `row + R <= m`.
            unsafe {
                let tile = w.bytes.as_ptr().add(t * blocks * B::BYTES);
                let mut row = 0;
                while m - row >= AVX2_ROWS {
                    tile_rows_avx2::<B, AVX2_ROWS>(tile, blocks, acts, row, t * TILE, valid, out);
                    row += AVX2_ROWS;
                }
                match m - row {
                    1 => tile_rows_avx2::<B, 1>(tile, blocks, acts, row, t * TILE, valid, out),
                    2 => tile_rows_avx2::<B, 2>(tile, blocks, acts, row, t * TILE, valid, out),
                    3 => tile_rows_avx2::<B, 3>(tile, blocks, acts, row, t * TILE, valid, out),
                    _ => {}
                }
            }
        }
    }

    /// `out[row + r][col..col + valid]` for `R` activation rows against one tile, its two halves
    /// in turn within each block (so the tile is read once, as one forward stream), with the
    /// same operations in the same order as [`tile_rows`]: the two instruction sets give the
    /// same bits.
    ///
    /// # Safety
    /// As [`tiles_avx2`]; `tile` points to a whole tile and rows `row..row + R` exist.
    #[inline(always)]
    unsafe fn tile_rows_avx2<B: Avx2Block, const R: usize>(
        tile: *const u8,
        blocks: usize,
        acts: &Activations,
        row: usize,
        col: usize,
        valid: usize,
        out: ColumnOutput,
    ) {
        // SAFETY: block `b < blocks` lies within the tile; activation row `row + r` has `k`
        // quants and `blocks` scales; AVX2, FMA and F16C are compiled in.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); R]; 2];
            for b in 0..blocks {
                let block = tile.add(b * B::BYTES);
                let mut line = 0;
                while line < B::BYTES {
                    _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES + line).cast());
                    line += 64;
                }
                for (half, acc) in acc.iter_mut().enumerate() {
                    let d_w = _mm256_cvtph_ps(_mm_loadu_si128(block.add(2 * HALF * half).cast()));
                    let m_w = if B::HAS_OFFSET {
                        _mm256_cvtph_ps(_mm_loadu_si128(block.add(2 * TILE + 2 * HALF * half).cast()))
                    } else {
                        _mm256_setzero_ps()
                    };
                    let w = B::load_half(block.add(B::QUANTS_AT), half);
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let i = (row + r) * blocks + b;
                        let mut dot = B::dot(&w, acts.qs.as_ptr().add(i * QK));
                        if B::NEEDS_START {
                            dot = _mm256_add_epi32(_mm256_set1_epi32(*acts.start.get_unchecked(i)), dot);
                        }
                        let scale = _mm256_mul_ps(d_w, _mm256_set1_ps(*acts.d.get_unchecked(i)));
                        *acc_r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, *acc_r);
                        if B::HAS_OFFSET {
                            *acc_r = _mm256_fmadd_ps(m_w, _mm256_set1_ps(*acts.ds.get_unchecked(i)), *acc_r);
                        }
                    }
                }
            }
            let mut lanes = [0f32; TILE];
            for (r, (&low, &high)) in acc[0].iter().zip(&acc[1]).enumerate() {
                _mm256_storeu_ps(lanes.as_mut_ptr(), low);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(HALF), high);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), out.ptr.add((row + r) * out.n + col), valid);
            }
        }
    }

    /// Every activation row against the tiles `tiles`, `ROWS` rows at a time.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F/BW and VNNI, `tiles` lie within `w`, `acts` holds `m` rows of
    /// `w.k` values, and no other thread writes the columns of `tiles`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tiles_vnni<B: TileBlock>(
        w: &PackedQ,
        acts: &Activations,
        m: usize,
        tiles: std::ops::Range<usize>,
        out: ColumnOutput,
    ) {
        let blocks = w.k / QK;
        assert!(tiles.end * blocks * B::BYTES <= w.bytes.len() && acts.qs.len() == m * acts.k);
        for t in tiles {
            let valid = (w.n - t * TILE).min(TILE);
            // SAFETY: tile `t` lies within `w.bytes` (asserted above); each call covers rows
            // `row..row + R` with `row + R <= m`.
            unsafe {
                let tile = w.bytes.as_ptr().add(t * blocks * B::BYTES);
                let mut row = 0;
                while m - row >= ROWS {
                    tile_rows::<B, ROWS>(tile, blocks, acts, row, t * TILE, valid, out);
                    row += ROWS;
                }
                match m - row {
                    1 => tile_rows::<B, 1>(tile, blocks, acts, row, t * TILE, valid, out),
                    2 => tile_rows::<B, 2>(tile, blocks, acts, row, t * TILE, valid, out),
                    3 => tile_rows::<B, 3>(tile, blocks, acts, row, t * TILE, valid, out),
                    4 => tile_rows::<B, 4>(tile, blocks, acts, row, t * TILE, valid, out),
                    5 => tile_rows::<B, 5>(tile, blocks, acts, row, t * TILE, valid, out),
                    6 => tile_rows::<B, 6>(tile, blocks, acts, row, t * TILE, valid, out),
                    7 => tile_rows::<B, 7>(tile, blocks, acts, row, t * TILE, valid, out),
                    _ => {}
                }
            }
        }
    }

    /// `out[row + r][col..col + valid]` for `R` activation rows against one tile, accumulated in
    /// registers over its blocks.
    ///
    /// # Safety
    /// As [`tiles_vnni`]; `tile` points to a whole tile and rows `row..row + R` exist.
    #[inline(always)]
    unsafe fn tile_rows<B: TileBlock, const R: usize>(
        tile: *const u8,
        blocks: usize,
        acts: &Activations,
        row: usize,
        col: usize,
        valid: usize,
        out: ColumnOutput,
    ) {
        // SAFETY: block `b < blocks` lies within the tile; activation row `row + r` has `k`
        // quants and `blocks` scales; the caller guarantees the instruction sets.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); R];
            for b in 0..blocks {
                let block = tile.add(b * B::BYTES);
                // The tiles are one forward stream: ask for the lines a few blocks ahead.
                let mut line = 0;
                while line < B::BYTES {
                    _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES + line).cast());
                    line += 64;
                }
                let d_w = _mm512_cvtph_ps(_mm256_loadu_si256(block.cast()));
                let m_w = if B::HAS_OFFSET {
                    _mm512_cvtph_ps(_mm256_loadu_si256(block.add(2 * TILE).cast()))
                } else {
                    _mm512_setzero_ps()
                };
                let w = B::unpack(block.add(B::QUANTS_AT));
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let i = (row + r) * blocks + b;
                    let x = acts.qs.as_ptr().add(i * QK).cast::<i32>();
                    let mut dot = _mm512_set1_epi32(*acts.start.get_unchecked(i));
                    for (g, &w_g) in w.iter().enumerate() {
                        dot = _mm512_dpbusd_epi32(dot, w_g, _mm512_set1_epi32(x.add(g).read_unaligned()));
                    }
                    let scale = _mm512_mul_ps(d_w, _mm512_set1_ps(*acts.d.get_unchecked(i)));
                    *acc_r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc_r);
                    if B::HAS_OFFSET {
                        *acc_r = _mm512_fmadd_ps(m_w, _mm512_set1_ps(*acts.ds.get_unchecked(i)), *acc_r);
                    }
                }
            }
            let mask: __mmask16 = if valid == TILE { 0xFFFF } else { (1u16 << valid) - 1 };
            for (r, &acc_r) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(out.ptr.add((row + r) * out.n + col), mask, acc_r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    use super::*;

    fn tensor(rows: usize, cols: usize, seed: u64) -> Tensor {
        crate::testing::random_tensor(&[rows, cols], 1.0, seed).expect("tensor")
    }

    const DTYPES: [GgmlDType; 3] = [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1];

    fn packed(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> Option<(QTensor, PackedQ)> {
        let q = QTensor::quantize(&tensor(n, k, seed), dtype).expect("quantize");
        let p = PackedQ::pack(&q).expect("pack")?;
        Some((q, p))
    }

    #[test]
    fn packing_keeps_every_weight_value_and_the_byte_count() {
        if !cpu_supported() {
            assert!(PackedQ::pack(&QTensor::quantize(&tensor(16, 32, 1), GgmlDType::Q8_0).unwrap()).unwrap().is_none());
            return;
        }
        for dtype in DTYPES {
            // 37 rows: two full tiles and a padded one.
            let (q, p) = packed(dtype, 37, 96, 3).expect("served");
            let want = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(p.dequantize().unwrap().to_vec2::<f32>().unwrap(), want, "{dtype:?}");
            let rows = p.dequantize_rows(&[36, 0, 17]).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(rows, vec![want[36].clone(), want[0].clone(), want[17].clone()]);
            assert_eq!(p.size_in_bytes(), 48 * 3 * dtype.type_size(), "{dtype:?}: 3 tiles of 16 GGUF rows");
            assert!(p.dequantize_rows(&[37]).is_err(), "rows past n are an error");
        }
    }

    /// The exact result of the quantized product: activations quantized per 32 values as
    /// candle does, block dot products in integers, scaled in f64.
    fn exact(q: &QTensor, x: &Tensor) -> Vec<Vec<f64>> {
        let w = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let xq = QTensor::quantize(x, GgmlDType::Q8_0).unwrap().dequantize(&Device::Cpu).unwrap();
        let xq = xq.to_vec2::<f32>().unwrap();
        xq.iter()
            .map(|xr| w.iter().map(|wr| xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum()).collect())
            .collect()
    }

    /// `x · wᵀ` by each kernel set this CPU runs (AVX2, and AVX-512 VNNI where present).
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    fn products_by_isa(p: &PackedQ, x: &Tensor) -> Vec<(x86::Isa, Vec<Vec<f32>>)> {
        x86::Isa::supported()
            .into_iter()
            .map(|isa| (isa, x86::matmul_t(p, x, isa).unwrap().expect("served").to_vec2::<f32>().unwrap()))
            .collect()
    }

    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    #[test]
    fn every_instruction_set_gives_the_same_bits_for_every_row_count() {
        assert!(x86::Isa::supported().contains(&x86::Isa::Avx2), "every x86-64-v3 CPU runs the AVX2 kernels");
        for dtype in DTYPES {
            // 45 columns: two whole tiles and a tile of one whole half and a partial one.
            let (_, p) = packed(dtype, 45, 160, 13).expect("served");
            for m in [1, 3, 4, 5, 9] {
                let x = tensor(m, 160, 200 + m as u64);
                let by_isa = products_by_isa(&p, &x);
                for (isa, got) in &by_isa[1..] {
                    assert_eq!(got, &by_isa[0].1, "{dtype:?} m={m}: {isa:?} differs from {:?}", by_isa[0].0);
                }
            }
        }
    }

    #[test]
    fn matches_the_exact_quantized_product_candle_and_the_row_major_kernel_for_every_row_count() {
        if !cpu_supported() {
            return;
        }
        for dtype in DTYPES {
            let (n, k) = (53, 192);
            let (q, p) = packed(dtype, n, k, 11).expect("served");
            let candle =
                QMatMul::from_arc(std::sync::Arc::new(QTensor::quantize(&tensor(n, k, 11), dtype).unwrap())).unwrap();
            for m in [1, 2, 3, 4, 5, 7, 8, 9, 17] {
                let x = tensor(m, k, 100 + m as u64);
                let got = p.matmul_t(&x).unwrap().expect("served").to_vec2::<f32>().unwrap();
                let want = exact(&q, &x);
                let theirs = candle.forward(&x).unwrap().to_vec2::<f32>().unwrap();
                let skinny = crate::skinny_quant::matmul_t(&x, &q).unwrap().expect("served").to_vec2::<f32>().unwrap();
                for r in 0..m {
                    for c in 0..n {
                        let (g, e) = (got[r][c] as f64, want[r][c]);
                        assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{dtype:?} m={m} [{r},{c}]: {g} vs exact {e}");
                        // candle's Q4_1 product rounds the activation sums through f16.
                        if dtype != GgmlDType::Q4_1 {
                            let t = theirs[r][c] as f64;
                            assert!(
                                (g - t).abs() <= 1e-4 * (1.0 + t.abs()),
                                "{dtype:?} m={m} [{r},{c}]: {g} vs candle {t}"
                            );
                        }
                        let s = skinny[r][c] as f64;
                        assert!(
                            (g - s).abs() <= 1e-4 * (1.0 + s.abs()),
                            "{dtype:?} m={m} [{r},{c}]: {g} vs skinny {s}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX2 kernels sum byte products in saturating i16 lanes: the largest quants there are
    /// (nibbles of 15, and Q8_0's -128, which candle never writes but GGUF files may hold)
    /// against activations at ±127 must still give the exact product.
    #[test]
    fn extreme_quants_do_not_saturate() {
        if !cpu_supported() {
            return;
        }
        let (n, k) = (16, 64);
        // Rows of one 0 then 1s: Q4 quants of 15 (Q4_1) or 0 / 15 (Q4_0, value -8 / 7).
        let ramp: Vec<f32> = (0..n * k).map(|i| if i % k == 0 { 0.0 } else { 1.0 }).collect();
        let ramp = Tensor::from_vec(ramp, (n, k), &Device::Cpu).unwrap();
        // Q8_0 blocks written by hand: scale 1, quants alternating -128 and 127.
        let q8_bytes: Vec<u8> = (0..n * k / QK)
            .flat_map(|_| {
                let scale = half::f16::ONE.to_le_bytes();
                scale.into_iter().chain((0..QK).map(|j| if j % 2 == 0 { 0x80 } else { 0x7F }))
            })
            .collect();
        let q8 = QTensor::new(
            candle_core::quantized::QStorage::from_data(
                std::borrow::Cow::Owned(q8_bytes),
                &Device::Cpu,
                GgmlDType::Q8_0,
            )
            .unwrap(),
            (n, k),
        )
        .unwrap();
        let weights = [
            QTensor::quantize(&ramp, GgmlDType::Q4_1).unwrap(),
            QTensor::quantize(&ramp, GgmlDType::Q4_0).unwrap(),
            q8,
        ];
        for q in &weights {
            let p = PackedQ::pack(q).unwrap().expect("served");
            for sign in [1.0f32, -1.0] {
                // Activations at ±127 after quantization, alternating like the Q8_0 weights or not.
                let alternating: Vec<f32> = (0..k).map(|j| if j % 2 == 0 { -sign } else { sign }).collect();
                let x = Tensor::from_vec([vec![sign; k], alternating].concat(), (2, k), &Device::Cpu).unwrap();
                let want = exact(q, &x);
                let got = p.matmul_t(&x).unwrap().expect("served").to_vec2::<f32>().unwrap();
                for r in 0..2 {
                    for c in 0..n {
                        let (g, e) = (got[r][c] as f64, want[r][c]);
                        assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{:?} [{r},{c}]: {g} vs exact {e}", q.dtype());
                    }
                }
            }
        }
    }

    #[test]
    fn a_rows_result_does_not_depend_on_the_other_rows() {
        if !cpu_supported() {
            return;
        }
        for dtype in DTYPES {
            let (_, p) = packed(dtype, 64, 128, 5).expect("served");
            let x = tensor(11, 128, 9);
            let all = p.matmul_t(&x).unwrap().unwrap().to_vec2::<f32>().unwrap();
            for r in [0, 6, 8, 10] {
                let alone = p.matmul_t(&x.narrow(0, r, 1).unwrap()).unwrap().unwrap().to_vec2::<f32>().unwrap();
                assert_eq!(alone[0], all[r], "{dtype:?}: row {r} alone differs from row {r} of 11, bit for bit");
            }
        }
    }

    #[test]
    fn spans_many_parallel_tasks() {
        if !cpu_supported() {
            return;
        }
        // 4000 rows x 576: many tasks of whole tiles, the last tile padded.
        let (q, p) = packed(GgmlDType::Q4_1, 4000, 576, 21).expect("served");
        let x = tensor(2, 576, 22);
        let got = p.matmul_t(&x).unwrap().unwrap().to_vec2::<f32>().unwrap();
        let want = exact(&q, &x);
        for r in 0..2 {
            for c in (0..4000).step_by(37).chain([3999]) {
                assert!((got[r][c] as f64 - want[r][c]).abs() <= 1e-4 * (1.0 + want[r][c].abs()));
            }
        }
    }

    #[test]
    fn declines_what_it_does_not_hold() {
        let q6 = QTensor::quantize(&tensor(16, 256, 1), GgmlDType::Q6K).unwrap();
        assert!(PackedQ::pack(&q6).unwrap().is_none(), "Q6K is not packed");
        if !cpu_supported() {
            return;
        }
        let (_, p) = packed(GgmlDType::Q8_0, 16, 64, 1).expect("served");
        let f16 = tensor(2, 64, 2).to_dtype(candle_core::DType::F16).unwrap();
        assert!(p.matmul_t(&f16).unwrap().is_none(), "f16 activations go elsewhere");
        assert!(p.matmul_t(&tensor(2, 32, 2)).is_err(), "a width mismatch is an error");
    }
}
