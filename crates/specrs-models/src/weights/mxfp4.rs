//! MXFP4 (OCP microscaling FP4), the format gpt-oss stores its experts in: each byte holds two
//! E2M1 values, the low nibble first, and each run of 32 values shares an E8M0 scale, the
//! power of two `2^(s - 127)`.

/// The 16 E2M1 values: sign bit, two exponent bits, one mantissa bit.
const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Bytes per block of 32 values.
pub const BLOCK_BYTES: usize = 16;

/// The values of `blocks` (`[.., groups, 16]` bytes) scaled by `scales` (`[.., groups]`, one
/// per 16 bytes): 32 values per scale, in order. `None` when the lengths disagree.
pub fn dequantize(blocks: &[u8], scales: &[u8]) -> Option<Vec<f32>> {
    if blocks.len() != scales.len() * BLOCK_BYTES {
        return None;
    }
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for (group, &s) in blocks.chunks_exact(BLOCK_BYTES).zip(scales) {
        let scale = 2f32.powi(i32::from(s) - 127);
        for &byte in group {
            out.push(E2M1[usize::from(byte & 0x0F)] * scale);
            out.push(E2M1[usize::from(byte >> 4)] * scale);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_nibbles_come_first_and_scales_are_powers_of_two() {
        // 0x2F: low nibble 0xF (-6), high nibble 0x2 (+1); scale 128 doubles, 126 halves.
        let mut blocks = vec![0x2F; BLOCK_BYTES];
        blocks.extend([0x91; BLOCK_BYTES]); // low 0x1 (+0.5), high 0x9 (-0.5)
        let values = dequantize(&blocks, &[128, 126]).unwrap();
        assert_eq!(values.len(), 64);
        assert_eq!(&values[..4], &[-12.0, 2.0, -12.0, 2.0]);
        assert_eq!(&values[32..36], &[0.25, -0.25, 0.25, -0.25]);
        assert!(dequantize(&blocks, &[127]).is_none(), "one scale per 16 bytes");
    }
}
