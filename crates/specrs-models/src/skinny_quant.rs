//! Quantized matmuls on CPU: `x [m, k] · wᵀ` for f32 activations and a GGUF weight `w [n, k]`
//! in Q8_0, Q4_0 or Q4_1 blocks, built for the skinny products of decoding (a token, or a token plus
//! the drafts it verifies) and serving every `m` so that results never depend on batch shape.
//!
//! Decoding on CPU is bound by memory bandwidth, so a step costs about one read of the weights,
//! and verifying K drafts with one forward over K + 1 tokens is only worth it if that forward
//! still reads every weight once. candle's quantized matmul walks the weights once per
//! activation row at these sizes, so its cost grows with m. Here instead:
//!
//! 1. the m activation rows are quantized once per call to Q8_0 blocks (per 32 values a scale
//!    `d = max|x| / 127` and `q = round(x / d)`, bit for bit what candle's `BlockQ8_0::from_float`
//!    computes, so results equal candle's up to the order of float additions);
//! 2. each weight block is loaded once, decoded to 32 signed bytes, and dotted with that block of
//!    every activation row while it sits in a register: int8 products summed into i32 lanes,
//!    scaled by `d_w · d_x` and accumulated in f32. Q4_1 blocks also carry an offset `m_w`
//!    (value `d_w · q + m_w`), whose share of the dot product is `m_w · d_x · Σq_x`: the sum of
//!    each activation block is taken once, when it is quantized;
//! 3. the weight rows are split across rayon tasks, each writing its own columns of the output.
//!
//! Two instruction sets: AVX2 (`vpmaddubsw` + `vpmaddwd` with the sign trick, compiled in by the
//! x86-64-v3 target) and AVX-512 VNNI (`vpdpbusd`, 4 products into an i32 lane in one
//! instruction, picked at runtime). Both take one unsigned byte operand: Q4_1's quants are
//! unsigned already and fill it as they are; signed weights need the sign trick (AVX2) or
//! activations offset by 128 (VNNI). Other targets get `None` and use candle.

use candle_core::quantized::QTensor;
use candle_core::{Result, Tensor};

/// `x [m, k] · w[n, k]ᵀ -> [m, n]`, or `None` when the operands are not served here: a device
/// other than the CPU, `x` not f32 or not 2-D, `m = 0`, `w` not Q8_0, Q4_0 or Q4_1, or `k`
/// not a whole number of 32-value blocks.
///
/// Every output element is computed the same way whatever `m` is (rows are quantized alone and
/// dotted in a fixed block order), so a token's logits do not depend on which other tokens share
/// the forward: speculative verification stays bit-identical to plain decoding at any batch size.
pub fn matmul_t(x: &Tensor, w: &QTensor) -> Result<Option<Tensor>> {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    return x86::matmul_t(x, w, x86::Isa::detect());
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        let _ = (x, w);
        Ok(None)
    }
}

/// Whether [`matmul_t`] multiplies weights of `dtype` in this build.
pub fn serves(dtype: candle_core::quantized::GgmlDType) -> bool {
    use candle_core::quantized::GgmlDType;
    cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))
        && matches!(dtype, GgmlDType::Q8_0 | GgmlDType::Q4_0 | GgmlDType::Q4_1)
}

/// Quantizes 32 activations to signed Q8_0 bytes exactly as candle's `BlockQ8_0::from_float`
/// does; returns the scale as f16 stores it. Shared with [`crate::packed_quant`].
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
pub(crate) fn quantize_block(x: &[f32; 32], q: &mut [u8; 32]) -> f32 {
    x86::quantize_block(x, q, false)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
mod x86 {
    use std::arch::x86_64::*;

    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{CpuStorage, DType, Result, Storage, Tensor};
    use half::f16;
    use rayon::prelude::*;

    use crate::compute::ColumnOutput;
    use crate::simd::hsum;

    /// Values per quantization block, in the weights and the activations alike.
    const QK: usize = 32;

    /// Activation rows per register tile: each decoded weight block feeds `ROWS` dot products.
    const ROWS: usize = 8;

    /// How far ahead of the block being multiplied the weight stream is prefetched. The
    /// hardware prefetchers alone left the m = 1 kernels waiting on DRAM (Q8_0 at ~9 GB/s, Q4_1
    /// at ~6 GB/s on a 2-core Xeon); 2 KiB ahead took a 3072x576 product from 204 to 106 µs
    /// (Q8_0) and from 175 to 71 µs (Q4_1), where 1 KiB and 4 KiB each did worse.
    const PREFETCH_BYTES: usize = 2048;

    /// Weight bytes per parallel task: enough work to amortise rayon's dispatch (a few µs per
    /// call), small enough that the 576-row matrices still split evenly across the cores.
    const TASK_BYTES: usize = 48 * 1024;

    /// The SIMD flavour of the dot products (`vpdpbusd` here on 256-bit registers).
    pub(super) use crate::simd::Isa;

    impl Isa {
        /// `vpdpbusd` multiplies unsigned by signed bytes: the activations are stored as
        /// `q + 128` for it and as plain `q` for the AVX2 sign trick.
        fn offset_activations(self) -> bool {
            self == Self::Avx512Vnni
        }
    }

    /// See [`super::matmul_t`]; `isa` picks the kernels.
    pub(super) fn matmul_t(x: &Tensor, w: &QTensor, isa: Isa) -> Result<Option<Tensor>> {
        let format = match w.dtype() {
            GgmlDType::Q8_0 => Format::Q8_0,
            GgmlDType::Q4_0 => Format::Q4_0,
            GgmlDType::Q4_1 => Format::Q4_1,
            _ => return Ok(None),
        };
        if !x.device().is_cpu() || !w.device().is_cpu() || x.dtype() != DType::F32 || x.rank() != 2 {
            return Ok(None);
        }
        let (m, k) = x.dims2()?;
        let (n, w_k) = w.shape().dims2()?;
        if m == 0 || n == 0 || k != w_k || !k.is_multiple_of(QK) {
            return Ok(None);
        }
        let weights = w.data()?; // borrowed, not copied, for CPU storage
        let row_bytes = k / QK * format.block_bytes();
        if weights.len() != n * row_bytes {
            candle_core::bail!(
                "{:?} weight {n}x{k} holds {} bytes, expected {}",
                w.dtype(),
                weights.len(),
                n * row_bytes
            );
        }

        let x = x.contiguous()?;
        let acts = {
            let (storage, layout) = x.storage_and_layout();
            let Storage::Cpu(CpuStorage::F32(xs)) = &*storage else {
                return Ok(None);
            };
            let wanted = ActivationLayout {
                offset: isa.offset_activations() && !format.unsigned(),
                sums: format == Format::Q4_1,
                pairs: isa == Isa::Avx512Vnni && (k / QK).is_multiple_of(2),
            };
            Activations::quantize(&xs[layout.start_offset()..][..m * k], m, k, wanted)
        };

        let mut out = vec![0f32; m * n];
        let out_ptr = ColumnOutput { ptr: out.as_mut_ptr(), n };
        let cols_per_task = (TASK_BYTES / row_bytes).clamp(1, n);
        let tasks = n.div_ceil(cols_per_task);
        let run = |task: usize| {
            let cols = task * cols_per_task..n.min((task + 1) * cols_per_task);
            // SAFETY: `weights` holds n rows of `row_bytes` (checked above) and `acts` the m rows
            // of `k` values they are dotted with; `out` is `[m, n]` and outlives the parallel
            // loop, whose tasks write disjoint column ranges of it. `Isa::Avx512Vnni` exists only
            // on CPUs that run it.
            unsafe {
                match (isa, format) {
                    (Isa::Avx2, Format::Q8_0) => rows_avx2::<Q8_0, Avx2>(&weights, &acts, cols, out_ptr),
                    (Isa::Avx2, Format::Q4_0) => rows_avx2::<Q4_0, Avx2>(&weights, &acts, cols, out_ptr),
                    (Isa::Avx2, Format::Q4_1) => rows_avx2::<Q4_1, Avx2Unsigned>(&weights, &acts, cols, out_ptr),
                    (Isa::Avx512Vnni, Format::Q8_0) => rows_vnni::<Q8_0, Vnni>(&weights, &acts, cols, out_ptr),
                    (Isa::Avx512Vnni, Format::Q4_0) => rows_vnni::<Q4_0, Vnni>(&weights, &acts, cols, out_ptr),
                    (Isa::Avx512Vnni, Format::Q4_1) => rows_vnni::<Q4_1, VnniUnsigned>(&weights, &acts, cols, out_ptr),
                }
            }
        };
        (0..tasks).into_par_iter().for_each(run);
        Ok(Some(Tensor::from_vec(out, (m, n), x.device())?))
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Format {
        Q8_0,
        Q4_0,
        Q4_1,
    }

    impl Format {
        /// The weights' quants are unsigned (`0..=15`): they can be the unsigned operand of the
        /// byte products themselves, with plain signed activations.
        fn unsigned(self) -> bool {
            self == Self::Q4_1
        }

        fn block_bytes(self) -> usize {
            match self {
                Self::Q8_0 => Q8_0::BYTES,
                Self::Q4_0 => Q4_0::BYTES,
                Self::Q4_1 => Q4_1::BYTES,
            }
        }
    }

    /// Activation rows quantized to Q8_0: `qs [m, k]` bytes (offset by 128 when the kernels
    /// want unsigned bytes), `d [k / 32, m]` block scales, already rounded through f16 like the
    /// scale candle stores, and `s [k / 32, m]` the blocks' values summed, `d · Σq` (for the
    /// offsets of Q4_1 weights). Both per-block arrays are padded by `ROWS` so a tile of rows
    /// loads its 8 lanes at once. `d_pairs [m, k / 64, 16]` repeats the scales of each pair of
    /// blocks 8 times each, the lanes the 512-bit kernels multiply a pair's dot products by.
    pub(super) struct Activations {
        m: usize,
        k: usize,
        qs: Vec<u8>,
        d: Vec<f32>,
        s: Vec<f32>,
        d_pairs: Vec<f32>,
    }

    /// What the kernels of one call read besides the quants and their scales.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct ActivationLayout {
        /// Quants stored as `q + 128` (VNNI with signed weights).
        pub(super) offset: bool,
        /// `s`, for weights with offsets.
        pub(super) sums: bool,
        /// `d_pairs`, for the two-block kernels.
        pub(super) pairs: bool,
    }

    impl Activations {
        pub(super) fn quantize(x: &[f32], m: usize, k: usize, layout: ActivationLayout) -> Self {
            assert_eq!(x.len(), m * k);
            let mut qs = vec![0u8; m * k];
            let blocks = k / QK;
            let mut d = vec![0f32; blocks * m + ROWS];
            let mut s = if layout.sums { vec![0f32; blocks * m + ROWS] } else { Vec::new() };
            let unoffset = if layout.offset { 0x80 } else { 0 };
            for (i, (src, dst)) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).enumerate() {
                let (r, b) = (i / blocks, i % blocks);
                let dst: &mut [u8; QK] = dst.try_into().expect("32 bytes");
                let d_x = quantize_block(src.try_into().expect("32 values"), dst, layout.offset);
                d[b * m + r] = d_x;
                if layout.sums {
                    let sum: i32 = dst.iter().map(|&q| i32::from((q ^ unoffset) as i8)).sum();
                    s[b * m + r] = d_x * sum as f32;
                }
            }
            let pairs = if layout.pairs { blocks / 2 } else { 0 };
            let mut d_pairs = vec![0f32; m * pairs * 2 * 8];
            for (i, lanes) in d_pairs.chunks_exact_mut(8).enumerate() {
                // Chunk i: row i / (2 · pairs), block i % (2 · pairs).
                let (r, b) = (i / (2 * pairs), i % (2 * pairs));
                lanes.fill(d[b * m + r]);
            }
            Self { m, k, qs, d, s, d_pairs }
        }

        /// Quantized for the two-block kernels.
        fn has_pairs(&self) -> bool {
            !self.d_pairs.is_empty()
        }

        /// Quantized row `r`, block `b`: its scale and its 32 bytes.
        #[cfg(test)]
        pub(super) fn block(&self, r: usize, b: usize) -> (f32, &[u8]) {
            let blocks = self.k / QK;
            (self.d[b * self.m + r], &self.qs[(r * blocks + b) * QK..][..QK])
        }
    }

    /// candle's `BlockQ8_0::from_float` on one block: writes `q = round(x / d)` (half away from
    /// zero, plus 128 when `offset`) and returns the scale `d = max|x| / 127` as f16 stores it.
    pub(super) fn quantize_block(x: &[f32; QK], q: &mut [u8; QK], offset: bool) -> f32 {
        // SAFETY: four 8-float loads cover `x` and one 32-byte store covers `q`, both exactly; AVX2
        // is compiled in.
        unsafe {
            let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(x.as_ptr().add(i)));
            let sign = _mm256_set1_ps(-0.0);
            let amax = v.iter().fold(_mm256_setzero_ps(), |acc, &v| _mm256_max_ps(acc, _mm256_andnot_ps(sign, v)));
            let amax = {
                let m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps::<1>(amax));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
            };
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let q32 = v.map(|v| {
                // f32::round: truncate, then step away from zero when the fraction is ≥ 0.5.
                let x = _mm256_mul_ps(v, id);
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
                let away =
                    _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_andnot_ps(sign, _mm256_sub_ps(x, t)), _mm256_set1_ps(0.5));
                let step = _mm256_and_ps(away, _mm256_or_ps(_mm256_and_ps(sign, x), _mm256_set1_ps(1.0)));
                _mm256_cvttps_epi32(_mm256_add_ps(t, step))
            });
            // The packs interleave 128-bit lanes; the permute restores element order.
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q32[0], q32[1]), _mm256_packs_epi32(q32[2], q32[3]));
            let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            let bytes = if offset { _mm256_xor_si256(bytes, _mm256_set1_epi8(i8::MIN)) } else { bytes };
            _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes);
            f16::from_f32(d).to_f32()
        }
    }

    /// A weight block layout, as candle stores it (`#[repr(C)]`, f16 scale first).
    trait Block {
        const BYTES: usize;

        /// Values are `d · q + m` rather than `d · q`.
        const HAS_OFFSET: bool = false;

        /// The block at `p` as 32 signed values and its scale in every lane.
        ///
        /// # Safety
        /// `p` points to `BYTES` readable bytes.
        unsafe fn load(p: *const u8) -> (__m256i, __m256);

        /// The block's offset `m` in every lane (only read when `HAS_OFFSET`).
        ///
        /// # Safety
        /// `p` points to `BYTES` readable bytes.
        #[inline(always)]
        unsafe fn load_offset(_p: *const u8) -> __m256 {
            // SAFETY: AVX is compiled in.
            unsafe { _mm256_setzero_ps() }
        }
    }

    /// `BlockQ8_0 { d: f16, qs: [i8; 32] }`.
    struct Q8_0;

    /// `BlockQ4_0 { d: f16, qs: [u8; 16] }`: value `j` is `(qs[j] & 0xF) - 8` for `j < 16` and
    /// `(qs[j - 16] >> 4) - 8` after.
    struct Q4_0;

    /// `BlockQ4_1 { d: f16, m: f16, qs: [u8; 16] }`: value `j` is `d · q_j + m` with `q_j` the
    /// nibbles in `Q4_0`'s order, unsigned (`0..=15`).
    struct Q4_1;

    /// The f16 scale at the start of a block, broadcast to every lane.
    ///
    /// # Safety
    /// `p` points to 16 readable bytes (every block is longer).
    #[inline(always)]
    unsafe fn load_scale(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 bytes; AVX2 and F16C are compiled in.
        unsafe {
            // A whole 16-byte load writes the full register, where a 2-byte `vpinsrw` into a
            // stale one would chain every block's scale to the previous block's accumulator.
            _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_loadu_si128(p.cast())))
        }
    }

    impl Block for Q8_0 {
        const BYTES: usize = 2 + QK;

        #[inline(always)]
        unsafe fn load(p: *const u8) -> (__m256i, __m256) {
            // SAFETY: the block is 2 scale bytes then 32 quant bytes, all readable.
            unsafe { (_mm256_loadu_si256(p.add(2).cast()), load_scale(p)) }
        }
    }

    impl Block for Q4_0 {
        const BYTES: usize = 2 + QK / 2;

        #[inline(always)]
        unsafe fn load(p: *const u8) -> (__m256i, __m256) {
            // SAFETY: the block is 2 scale bytes then 16 nibble bytes, all readable; AVX2 is
            // compiled in.
            unsafe {
                let packed = _mm_loadu_si128(p.add(2).cast());
                let nibbles =
                    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed), _mm256_set1_epi8(0x0F));
                (_mm256_sub_epi8(nibbles, _mm256_set1_epi8(8)), load_scale(p))
            }
        }
    }

    impl Block for Q4_1 {
        const BYTES: usize = 4 + QK / 2;
        const HAS_OFFSET: bool = true;

        #[inline(always)]
        unsafe fn load(p: *const u8) -> (__m256i, __m256) {
            // SAFETY: the block is 2 scale bytes, 2 offset bytes, then 16 nibble bytes, all
            // readable; AVX2 is compiled in.
            unsafe {
                let packed = _mm_loadu_si128(p.add(4).cast());
                let nibbles =
                    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed), _mm256_set1_epi8(0x0F));
                (nibbles, load_scale(p))
            }
        }

        #[inline(always)]
        unsafe fn load_offset(p: *const u8) -> __m256 {
            // SAFETY: 16 bytes from `p + 2` end inside the 20-byte block.
            unsafe { load_scale(p.add(2)) }
        }
    }

    /// How one instruction set dots 32 signed weight bytes with 32 quantized activations.
    trait Dot {
        /// Per weight block, shared by every activation row it meets.
        type Prepared: Copy;

        /// # Safety
        /// The CPU supports the instruction set.
        unsafe fn prepare(w: __m256i) -> Self::Prepared;

        /// `x · w` as 8 i32 lanes of partial sums.
        ///
        /// # Safety
        /// The CPU supports the instruction set.
        unsafe fn dot(w: __m256i, prepared: Self::Prepared, x: __m256i) -> __m256i;
    }

    /// AVX2: `vpmaddubsw` wants one unsigned operand, so it multiplies `|w|` by `x` carrying
    /// `w`'s sign; products of `|w| ≤ 128` and `|x| ≤ 127` sum in pairs without saturating.
    struct Avx2;

    impl Dot for Avx2 {
        type Prepared = __m256i;

        #[inline(always)]
        unsafe fn prepare(w: __m256i) -> __m256i {
            // SAFETY: AVX2 is compiled in.
            unsafe { _mm256_sign_epi8(w, w) }
        }

        #[inline(always)]
        unsafe fn dot(w: __m256i, abs_w: __m256i, x: __m256i) -> __m256i {
            // SAFETY: AVX2 is compiled in.
            unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1)) }
        }
    }

    /// AVX-512 VNNI: `vpdpbusd` sums four `u8 · i8` products into each i32 lane. The
    /// activations come as `x + 128`, so each lane starts from `-128 · Σw` of its four weights,
    /// computed once per weight block.
    struct Vnni;

    impl Dot for Vnni {
        type Prepared = __m256i;

        #[inline(always)]
        unsafe fn prepare(w: __m256i) -> __m256i {
            // SAFETY: the caller guarantees VNNI.
            unsafe {
                let bias = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(i8::MIN), w);
                _mm256_sub_epi32(_mm256_setzero_si256(), bias)
            }
        }

        #[inline(always)]
        unsafe fn dot(w: __m256i, neg_bias: __m256i, x: __m256i) -> __m256i {
            // SAFETY: the caller guarantees VNNI.
            unsafe { _mm256_dpbusd_epi32(neg_bias, x, w) }
        }
    }

    /// Unsigned weights (`0..=15`) on AVX2: `vpmaddubsw` takes them as its unsigned operand
    /// as they are, no sign trick; pairs of products (at most 2 · 15 · 127) cannot saturate.
    struct Avx2Unsigned;

    impl Dot for Avx2Unsigned {
        type Prepared = ();

        #[inline(always)]
        unsafe fn prepare(_w: __m256i) {}

        #[inline(always)]
        unsafe fn dot(w: __m256i, _: (), x: __m256i) -> __m256i {
            // SAFETY: AVX2 is compiled in.
            unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)) }
        }
    }

    /// Unsigned weights on AVX-512 VNNI: `vpdpbusd` with the weights as its unsigned operand
    /// and plain signed activations, so no `-128 · Σw` correction per block.
    struct VnniUnsigned;

    impl Dot for VnniUnsigned {
        type Prepared = ();

        #[inline(always)]
        unsafe fn prepare(_w: __m256i) {}

        #[inline(always)]
        unsafe fn dot(w: __m256i, _: (), x: __m256i) -> __m256i {
            // SAFETY: the caller guarantees VNNI.
            unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x) }
        }
    }

    /// [`Dot`] on two blocks at once, in 512-bit registers: blocks `b` and `b + 1` of a row are
    /// adjacent in memory for the activations, so one load covers both.
    trait Dot512 {
        type Prepared: Copy;

        /// # Safety
        /// The CPU supports AVX-512 F/BW/VL and VNNI.
        unsafe fn prepare(w: __m512i) -> Self::Prepared;

        /// `x · w` as 16 i32 lanes of partial sums, 8 per block.
        ///
        /// # Safety
        /// As [`Dot512::prepare`].
        unsafe fn dot(w: __m512i, prepared: Self::Prepared, x: __m512i) -> __m512i;
    }

    impl Dot512 for Vnni {
        type Prepared = __m512i;

        #[inline(always)]
        unsafe fn prepare(w: __m512i) -> __m512i {
            // SAFETY: the caller guarantees VNNI.
            unsafe {
                let bias = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(i8::MIN), w);
                _mm512_sub_epi32(_mm512_setzero_si512(), bias)
            }
        }

        #[inline(always)]
        unsafe fn dot(w: __m512i, neg_bias: __m512i, x: __m512i) -> __m512i {
            // SAFETY: the caller guarantees VNNI.
            unsafe { _mm512_dpbusd_epi32(neg_bias, x, w) }
        }
    }

    impl Dot512 for VnniUnsigned {
        type Prepared = ();

        #[inline(always)]
        unsafe fn prepare(_w: __m512i) {}

        #[inline(always)]
        unsafe fn dot(w: __m512i, _: (), x: __m512i) -> __m512i {
            // SAFETY: the caller guarantees VNNI.
            unsafe { _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x) }
        }
    }

    /// ColumnOutput columns `cols` (weight rows) for every activation row, AVX2 kernels.
    ///
    /// # Safety
    /// `w` holds the weight rows of `cols`, `out` is `[acts.m, n]` with `cols.end <= n`, no
    /// other thread touches those columns meanwhile, and the activations are quantized the way
    /// `D` reads them (offset or not).
    unsafe fn rows_avx2<B: Block, D: Dot>(
        w: &[u8],
        acts: &Activations,
        cols: std::ops::Range<usize>,
        out: ColumnOutput,
    ) {
        // SAFETY: forwarded from the caller; AVX2 is compiled in.
        unsafe { rows::<Single<B, D>>(w, acts, cols, out) }
    }

    /// As [`rows_avx2`] with VNNI kernels, compiled with AVX-512 enabled.
    ///
    /// # Safety
    /// As [`rows_avx2`], and the CPU supports AVX-512 F/BW/VL and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn rows_vnni<B: Block, D: Dot + Dot512>(
        w: &[u8],
        acts: &Activations,
        cols: std::ops::Range<usize>,
        out: ColumnOutput,
    ) {
        // SAFETY: forwarded from the caller; `has_pairs` means `k / 32` is even.
        unsafe {
            if acts.has_pairs() {
                rows::<Pairs<B, D>>(w, acts, cols, out)
            } else {
                rows::<Single<B, D>>(w, acts, cols, out)
            }
        }
    }

    /// How `R` activation rows meet one weight row: [`tile`] or [`tile_pairs`].
    trait Tile {
        /// Bytes per weight block.
        const BYTES: usize;

        /// # Safety
        /// As the tile function it runs.
        unsafe fn run<const R: usize>(w: *const u8, acts: &Activations, row: usize, col: usize, out: ColumnOutput);
    }

    /// One block per step, 256-bit registers.
    struct Single<B, D>(std::marker::PhantomData<(B, D)>);

    impl<B: Block, D: Dot> Tile for Single<B, D> {
        const BYTES: usize = B::BYTES;

        #[inline(always)]
        unsafe fn run<const R: usize>(w: *const u8, acts: &Activations, row: usize, col: usize, out: ColumnOutput) {
            // SAFETY: forwarded from the caller.
            unsafe { tile::<B, D, R>(w, acts, row, col, out) }
        }
    }

    /// Two blocks per step, 512-bit registers.
    struct Pairs<B, D>(std::marker::PhantomData<(B, D)>);

    impl<B: Block, D: Dot512> Tile for Pairs<B, D> {
        const BYTES: usize = B::BYTES;

        #[inline(always)]
        unsafe fn run<const R: usize>(w: *const u8, acts: &Activations, row: usize, col: usize, out: ColumnOutput) {
            // SAFETY: forwarded from the caller.
            unsafe { tile_pairs::<B, D, R>(w, acts, row, col, out) }
        }
    }

    /// Each weight row of `cols` against every activation row, `ROWS` activation rows at a time.
    ///
    /// One weight row per tile keeps the reads a single forward stream, which the hardware
    /// prefetchers follow at full bandwidth; interleaving rows (as a 2- or 4-row tile does, 612
    /// bytes apart within a page) halved the bandwidth from DRAM at m = 1 and saved no work.
    ///
    /// # Safety
    /// As [`rows_avx2`], and the instruction sets `T` uses are available.
    #[inline(always)]
    unsafe fn rows<T: Tile>(w: &[u8], acts: &Activations, cols: std::ops::Range<usize>, out: ColumnOutput) {
        let row_bytes = acts.k / QK * T::BYTES;
        assert!(cols.end * row_bytes <= w.len() && acts.qs.len() == acts.m * acts.k);
        for col in cols {
            // SAFETY: weight row `col < cols.end` lies within `w` (asserted above); each call
            // covers activation rows `row..row + R` with `row + R <= m`.
            unsafe {
                let w = w.as_ptr().add(col * row_bytes);
                let mut row = 0;
                while acts.m - row >= ROWS {
                    T::run::<ROWS>(w, acts, row, col, out);
                    row += ROWS;
                }
                match acts.m - row {
                    1 => T::run::<1>(w, acts, row, col, out),
                    2 => T::run::<2>(w, acts, row, col, out),
                    3 => T::run::<3>(w, acts, row, col, out),
                    4 => T::run::<4>(w, acts, row, col, out),
                    5 => T::run::<5>(w, acts, row, col, out),
                    6 => T::run::<6>(w, acts, row, col, out),
                    7 => T::run::<7>(w, acts, row, col, out),
                    _ => {}
                }
            }
        }
    }

    /// `out[row + r][col] = x_{row + r} · w` for `R` activation rows, accumulated in registers
    /// over the `k / 32` blocks of the weight row `w`.
    ///
    /// # Safety
    /// `w` points to a weight row of `k / 32` blocks, activation rows `row..row + R` exist, and
    /// `out` has column `col` of those rows to itself.
    #[inline(always)]
    unsafe fn tile<B: Block, D: Dot, const R: usize>(
        w: *const u8,
        acts: &Activations,
        row: usize,
        col: usize,
        out: ColumnOutput,
    ) {
        let blocks = acts.k / QK;
        debug_assert!(!B::HAS_OFFSET || !acts.s.is_empty(), "offset weights need the activation sums");
        // SAFETY: block `b < blocks` lies within the weight row; activation row `row + r` has
        // `k` bytes and `blocks` scales; AVX2 and FMA are compiled in, `D`'s set is available.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); R];
            // Lane r: the offsets' share `Σ_b m_w · s_x` of activation row `row + r`.
            let mut offsets = _mm256_setzero_ps();
            let mut scales = [0f32; ROWS];
            for b in 0..blocks {
                let block = w.add(b * B::BYTES);
                // The weights are one forward stream: ask for the lines a few blocks ahead.
                _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES).cast());
                let (w_b, d_w) = B::load(block);
                let prepared = D::prepare(w_b);
                _mm256_storeu_ps(
                    scales.as_mut_ptr(),
                    _mm256_mul_ps(d_w, _mm256_loadu_ps(acts.d.as_ptr().add(b * acts.m + row))),
                );
                if B::HAS_OFFSET {
                    let s_x = _mm256_loadu_ps(acts.s.as_ptr().add(b * acts.m + row));
                    offsets = _mm256_fmadd_ps(B::load_offset(block), s_x, offsets);
                }
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let i = (row + r) * blocks + b;
                    let x = _mm256_loadu_si256(acts.qs.as_ptr().add(i * QK).cast());
                    let dot = _mm256_cvtepi32_ps(D::dot(w_b, prepared, x));
                    *acc_r = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(&scales[r]), *acc_r);
                }
            }
            let mut offset = [0f32; ROWS];
            _mm256_storeu_ps(offset.as_mut_ptr(), offsets);
            for (r, &acc_r) in acc.iter().enumerate() {
                *out.ptr.add((row + r) * out.n + col) = hsum(acc_r) + offset[r];
            }
        }
    }

    /// [`tile`] two blocks at a time: the pair's 64 weights in one 512-bit register, each
    /// activation row's 64 quants in one load, and per row one multiply by the rows' scales
    /// (`d_pairs`) and one multiply-add by the weights' scales, half the per-row instructions
    /// of `tile`, which is what verifying several tokens per step spends its time on.
    ///
    /// # Safety
    /// As [`tile`], `k / 32` is even, and the CPU supports AVX-512 F/BW/VL and VNNI.
    #[inline(always)]
    unsafe fn tile_pairs<B: Block, D: Dot512, const R: usize>(
        w: *const u8,
        acts: &Activations,
        row: usize,
        col: usize,
        out: ColumnOutput,
    ) {
        let blocks = acts.k / QK;
        let pairs = blocks / 2;
        debug_assert!(blocks.is_multiple_of(2) && acts.d_pairs.len() == acts.m * blocks * 8);
        debug_assert!(!B::HAS_OFFSET || !acts.s.is_empty(), "offset weights need the activation sums");
        // SAFETY: blocks `2p`, `2p + 1` lie within the weight row; activation row `row + r` has
        // `k` bytes, `blocks` scales and `pairs` 16-lane scale pairs; the caller guarantees the
        // instruction sets.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); R];
            let mut offsets = _mm256_setzero_ps();
            for p in 0..pairs {
                let b = 2 * p;
                let (block0, block1) = (w.add(b * B::BYTES), w.add((b + 1) * B::BYTES));
                _mm_prefetch::<_MM_HINT_T0>(block0.wrapping_add(PREFETCH_BYTES).cast());
                _mm_prefetch::<_MM_HINT_T0>(block1.wrapping_add(PREFETCH_BYTES).cast());
                let (w0, d0) = B::load(block0);
                let (w1, d1) = B::load(block1);
                let w_pair = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1);
                let d_w = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(d0)),
                    _mm256_castps_pd(d1),
                ));
                let prepared = D::prepare(w_pair);
                if B::HAS_OFFSET {
                    let s0 = _mm256_loadu_ps(acts.s.as_ptr().add(b * acts.m + row));
                    let s1 = _mm256_loadu_ps(acts.s.as_ptr().add((b + 1) * acts.m + row));
                    offsets = _mm256_fmadd_ps(B::load_offset(block0), s0, offsets);
                    offsets = _mm256_fmadd_ps(B::load_offset(block1), s1, offsets);
                }
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let x = _mm512_loadu_si512(acts.qs.as_ptr().add(((row + r) * blocks + b) * QK).cast());
                    let dot = _mm512_cvtepi32_ps(D::dot(w_pair, prepared, x));
                    let d_x = _mm512_loadu_ps(acts.d_pairs.as_ptr().add(((row + r) * pairs + p) * 16));
                    *acc_r = _mm512_fmadd_ps(_mm512_mul_ps(dot, d_x), d_w, *acc_r);
                }
            }
            let mut offset = [0f32; ROWS];
            _mm256_storeu_ps(offset.as_mut_ptr(), offsets);
            for (r, &acc_r) in acc.iter().enumerate() {
                let halves = _mm256_add_ps(
                    _mm512_castps512_ps256(acc_r),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc_r))),
                );
                *out.ptr.add((row + r) * out.n + col) = hsum(halves) + offset[r];
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{DType, Device, Module, Tensor};
    use half::f16;
    use std::sync::Arc;

    use super::x86::{ActivationLayout, Activations, Isa, matmul_t};

    /// Deterministic values spread like activations: mostly small, a few outliers per block.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if i % 29 == 3 { 8.0 * u } else { u }
            })
            .collect()
    }

    fn tensor(rows: usize, cols: usize, seed: u64) -> Tensor {
        Tensor::from_vec(values(rows * cols, seed), (rows, cols), &Device::Cpu).unwrap()
    }

    fn to_rows(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
    }

    /// candle's own Q8_0 blocks of `x`: per 32 values the f16 scale and the quants.
    fn candle_q8_0(x: &Tensor) -> Vec<(f32, [i8; 32])> {
        let q = QTensor::quantize(x, GgmlDType::Q8_0).unwrap();
        q.data()
            .unwrap()
            .chunks_exact(34)
            .map(|b| (f16::from_le_bytes([b[0], b[1]]).to_f32(), std::array::from_fn(|j| b[2 + j] as i8)))
            .collect()
    }

    #[test]
    fn quantizes_activations_bit_for_bit_like_candle() {
        // Random rows, an all-zero block, and a block of exact ties (d = 1: x.5 rounds away from 0).
        let mut x = values(3 * 96, 7);
        x[96..128].fill(0.0);
        for (j, v) in x[128..160].iter_mut().enumerate() {
            *v = if j == 0 { 127.0 } else { (j as f32 - 16.0) + 0.5 };
        }
        let blocks = candle_q8_0(&Tensor::from_slice(&x, (3, 96), &Device::Cpu).unwrap());
        for offset in [false, true] {
            let acts = Activations::quantize(&x, 3, 96, ActivationLayout { offset, sums: true, pairs: false });
            for (i, (want_d, want_q)) in blocks.iter().enumerate() {
                let (d, qs) = acts.block(i / 3, i % 3);
                assert_eq!(d.to_bits(), want_d.to_bits(), "block {i} scale");
                let got: Vec<i8> = qs.iter().map(|&q| (q ^ if offset { 0x80 } else { 0 }) as i8).collect();
                assert_eq!(got, want_q, "block {i} quants (offset {offset})");
            }
        }
    }

    /// Checks `matmul_t` on `x [m, k]` and `w [n, k]` quantized to `dtype`, with every kernel
    /// flavour the CPU runs, against:
    /// - the exact integer result: candle's Q8_0 activations dequantized, dotted in f64 with the
    ///   dequantized weight (float-summation noise only);
    /// - candle's `QMatMul::forward`, when `exact_candle` (candle quantizes the activations the
    ///   same way), else within both sides' activation-quantization error;
    /// - the f32 product with the dequantized weight, within the activation-quantization error.
    fn check(dtype: GgmlDType, m: usize, k: usize, n: usize, exact_candle: bool) {
        let x = tensor(m, k, (m * 1000 + k + n) as u64);
        let w = Arc::new(QTensor::quantize(&tensor(n, k, (n * 7 + k) as u64), dtype).unwrap());
        let wd = to_rows(&w.dequantize(&Device::Cpu).unwrap());
        let xs = to_rows(&x);
        let xq = candle_q8_0(&x);
        let candle = to_rows(&QMatMul::from_arc(w.clone()).unwrap().forward(&x).unwrap());
        for isa in Isa::supported() {
            let ours = to_rows(&matmul_t(&x, &w, isa).unwrap().expect("served"));
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut f32_ref, mut magnitude, mut q_err, mut q_err_256) =
                        (0f64, 0f64, 0f64, 0f64, 0f64);
                    for t in 0..k {
                        let (d, q) = xq[(i * k + t) / 32];
                        let (xv, wv) = (xs[i][t] as f64, wd[j][t] as f64);
                        exact += d as f64 * q[t % 32] as f64 * wv;
                        f32_ref += xv * wv;
                        magnitude += (xv * wv).abs();
                        // |x - d·q| ≤ d / 2 plus the f16 rounding of d (≤ 2⁻¹¹ relative).
                        q_err += wv.abs() * (0.51 * d as f64 + xv.abs() / 1024.0);
                        let amax_256 = xs[i][t / 256 * 256..(t / 256 * 256 + 256).min(k)]
                            .iter()
                            .fold(0f32, |a, v| a.max(v.abs())) as f64;
                        q_err_256 += wv.abs() * (amax_256 / 127.0 + xv.abs() / 1024.0);
                    }
                    let noise = 1e-5 * magnitude + 1e-6;
                    let at = format!("{dtype:?} {isa:?} m={m} k={k} n={n} [{i}, {j}]");
                    let got = ours[i][j] as f64;
                    assert!((got - exact).abs() <= noise, "{at}: ours {got} vs exact {exact}");
                    assert!((got - f32_ref).abs() <= q_err + noise, "{at}: ours {got} vs f32 {f32_ref}");
                    let candle_tol = if exact_candle { noise } else { q_err + q_err_256 + noise };
                    let theirs = candle[i][j] as f64;
                    assert!((got - theirs).abs() <= candle_tol, "{at}: ours {got} vs candle {theirs}");
                }
            }
        }
    }

    #[test]
    fn matches_candle_for_every_row_count_and_odd_n() {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
            for (k, n) in [(32, 5), (96, 9), (576, 37), (1536, 19)] {
                for m in (1..=17).chain([40]) {
                    check(dtype, m, k, n, true);
                }
            }
        }
        // candle's Q4_1 product stores the activation sums as f16 (close, not exact) and wants
        // an even number of blocks per row.
        for (k, n) in [(64, 5), (128, 9), (576, 37), (1536, 19)] {
            for m in (1..=17).chain([40]) {
                check(GgmlDType::Q4_1, m, k, n, false);
            }
        }
    }

    #[test]
    fn a_rows_result_does_not_depend_on_the_other_rows() {
        // Batch invariance: row 3 of a 3-row, a 21-row and a 64-row product must be the same
        // bits, or speculative verification (more rows) could diverge from plain decoding.
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1] {
            let w = QTensor::quantize(&tensor(37, 576, 11), dtype).unwrap();
            let tall = tensor(64, 576, 12);
            let full = to_rows(&super::matmul_t(&tall, &w).unwrap().expect("served"));
            for m in [1, 3, 8, 21] {
                let rows = tall.narrow(0, 64 - m, m).unwrap();
                let part = to_rows(&super::matmul_t(&rows, &w).unwrap().expect("served"));
                for (i, row) in part.iter().enumerate() {
                    let want = &full[64 - m + i];
                    assert!(
                        row.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{dtype:?}: row {} differs between m = {m} and m = 64",
                        64 - m + i
                    );
                }
            }
        }
    }

    #[test]
    fn spans_several_parallel_tasks() {
        // Enough rows for many tasks, with a last task holding a single row.
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
            check(dtype, 5, 576, 1001, true);
        }
        check(GgmlDType::Q4_1, 5, 576, 1001, false);
    }

    #[test]
    fn agrees_with_candle_where_it_quantizes_activations_per_256() {
        // candle repacks Q8_0 weights with k % 256 == 0 and n % 16 == 0 for AVX-512 VNNI and
        // quantizes the activations to Q8_K there.
        check(GgmlDType::Q8_0, 4, 1536, 64, false);
    }

    #[test]
    fn declines_what_it_does_not_serve() {
        let w8 = QTensor::quantize(&tensor(8, 64, 1), GgmlDType::Q8_0).unwrap();
        let x = tensor(2, 64, 2);
        let none = |x: &Tensor, w: &QTensor| super::matmul_t(x, w).unwrap().is_none();
        assert!(none(&Tensor::zeros((0, 64), DType::F32, &Device::Cpu).unwrap(), &w8), "no rows");
        assert!(none(&x.to_dtype(DType::F16).unwrap(), &w8), "f16 activations");
        assert!(none(&x.reshape((1, 2, 64)).unwrap(), &w8), "3-D activations");
        let q4k = QTensor::quantize(&tensor(8, 256, 4), GgmlDType::Q4K).unwrap();
        assert!(none(&tensor(2, 256, 5), &q4k), "Q4_K weight");
        let f32_w = QTensor::quantize(&tensor(8, 48, 6), GgmlDType::F32).unwrap();
        assert!(none(&tensor(2, 48, 7), &f32_w), "k not a multiple of 32 (and not quantized)");
        let w8_32 = QTensor::quantize(&tensor(8, 32, 8), GgmlDType::Q8_0).unwrap();
        assert!(none(&x, &w8_32), "mismatched k, left to candle to report");
    }
}
