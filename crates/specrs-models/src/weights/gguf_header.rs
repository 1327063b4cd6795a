//! A look at a GGUF header before candle parses it: candle divides by `general.alignment`
//! unchecked, so a file that declares 0 would panic the loader. llama.cpp refuses any
//! alignment that is not a power of two; so does this.

use std::io::{Read, Seek, SeekFrom};

/// Deepest array nesting walked (llama.cpp writes flat arrays).
const MAX_DEPTH: usize = 4;

/// The declared `general.alignment` (the last, if the key repeats: candle keeps the last), if
/// the file declares one as an integer. `None` as well for a header this walk cannot follow:
/// candle's parser then reports what is wrong with it.
pub fn declared_alignment<R: Read + Seek>(reader: &mut R) -> Option<i128> {
    let start = reader.stream_position().ok()?;
    let found = walk_metadata(reader);
    reader.seek(SeekFrom::Start(start)).ok()?;
    found
}

/// Checks the declared alignment: a power of two, as every GGUF writer produces.
pub fn check_alignment(alignment: Option<i128>) -> Result<(), String> {
    match alignment {
        Some(a) if !u64::try_from(a).is_ok_and(u64::is_power_of_two) => Err(format!(
            "general.alignment is {a}; GGUF tensor data alignment must be a power of two (llama.cpp writes 32): \
             the file is corrupt, convert or download it again"
        )),
        _ => Ok(()),
    }
}

fn walk_metadata<R: Read + Seek>(reader: &mut R) -> Option<i128> {
    let magic = read_u32(reader)?;
    if magic != 0x4655_4747 && magic != 0x4747_5546 {
        return None;
    }
    let wide = match read_u32(reader)? {
        1 => false,
        2 | 3 => true,
        _ => return None,
    };
    let _tensor_count = read_len(reader, wide)?;
    let kv_count = read_len(reader, wide)?;
    // Each entry reads bytes, so a count past the file's size ends at its end.
    let mut alignment = None;
    for _ in 0..kv_count {
        let key_len = read_len(reader, wide)?;
        let mut key = vec![0u8; usize::try_from(key_len).ok().filter(|&n| n <= 1 << 16)?];
        reader.read_exact(&mut key).ok()?;
        let value_type = read_u32(reader)?;
        match read_integer(reader, value_type) {
            Some(value) if key == b"general.alignment" => alignment = Some(value),
            Some(_) => {}
            None => skip_value(reader, value_type, wide, 0)?,
        }
    }
    alignment
}

/// An integer-typed value, read; `None` (nothing read) for other types.
fn read_integer<R: Read>(reader: &mut R, value_type: u32) -> Option<i128> {
    let width = match value_type {
        0 | 1 => 1,
        2 | 3 => 2,
        4 | 5 => 4,
        10 | 11 => 8,
        _ => return None,
    };
    let mut bytes = [0u8; 8];
    reader.read_exact(&mut bytes[..width]).ok()?;
    let unsigned = u64::from_le_bytes(bytes);
    let signed = matches!(value_type, 1 | 3 | 5 | 11);
    Some(if signed {
        // Sign-extend from the value's width.
        let shift = 64 - 8 * width as u32;
        i128::from(((unsigned << shift) as i64) >> shift)
    } else {
        i128::from(unsigned)
    })
}

/// Fixed byte sizes of the GGUF scalar types (strings and arrays are variable).
fn scalar_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn skip_value<R: Read + Seek>(reader: &mut R, value_type: u32, wide: bool, depth: usize) -> Option<()> {
    if let Some(size) = scalar_size(value_type) {
        return skip(reader, size);
    }
    match value_type {
        8 => {
            let len = read_len(reader, wide)?;
            skip(reader, len)
        }
        9 if depth < MAX_DEPTH => {
            let item_type = read_u32(reader)?;
            let len = read_len(reader, wide)?;
            if let Some(size) = scalar_size(item_type) {
                return skip(reader, len.checked_mul(size)?);
            }
            for _ in 0..len {
                skip_value(reader, item_type, wide, depth + 1)?;
            }
            Some(())
        }
        _ => None,
    }
}

/// Skips `n` bytes (within a `BufReader`'s buffer, without a system call, when it holds them);
/// a skip past the end fails at the next read.
fn skip<R: Seek>(reader: &mut R, n: u64) -> Option<()> {
    reader.seek_relative(i64::try_from(n).ok()?).ok()
}

fn read_u32<R: Read>(reader: &mut R) -> Option<u32> {
    let mut b = [0u8; 4];
    reader.read_exact(&mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn read_len<R: Read>(reader: &mut R, wide: bool) -> Option<u64> {
    if !wide {
        return read_u32(reader).map(u64::from);
    }
    let mut b = [0u8; 8];
    reader.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A v3 header with a string, an array of strings, an array of u32 and the alignment.
    fn header(alignment_type: u32, alignment: &[u8]) -> Vec<u8> {
        header_with(alignment_type, alignment, None)
    }

    /// The same with a second `general.alignment` entry (u32) at the end.
    fn header_with(alignment_type: u32, alignment: &[u8], repeated: Option<u32>) -> Vec<u8> {
        fn string(out: &mut Vec<u8>, s: &str) {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        let mut out = Vec::new();
        out.extend(0x4655_4747u32.to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((4 + u64::from(repeated.is_some())).to_le_bytes());
        string(&mut out, "general.architecture");
        out.extend(8u32.to_le_bytes());
        string(&mut out, "llama");
        string(&mut out, "tokenizer.ggml.tokens");
        out.extend(9u32.to_le_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        string(&mut out, "a");
        string(&mut out, "bc");
        string(&mut out, "tokenizer.ggml.token_type");
        out.extend(9u32.to_le_bytes());
        out.extend(4u32.to_le_bytes());
        out.extend(3u64.to_le_bytes());
        out.extend([0u8; 12]);
        string(&mut out, "general.alignment");
        out.extend(alignment_type.to_le_bytes());
        out.extend(alignment);
        if let Some(again) = repeated {
            string(&mut out, "general.alignment");
            out.extend(4u32.to_le_bytes());
            out.extend(again.to_le_bytes());
        }
        out
    }

    #[test]
    fn the_alignment_is_found_past_strings_and_arrays() {
        let mut r = Cursor::new(header(4, &64u32.to_le_bytes()));
        assert_eq!(declared_alignment(&mut r), Some(64));
        assert_eq!(r.position(), 0, "the reader is left where it was");
        assert_eq!(declared_alignment(&mut Cursor::new(header(5, &(-8i32).to_le_bytes()))), Some(-8));
        assert_eq!(declared_alignment(&mut Cursor::new(header(0, &[16]))), Some(16));
        assert_eq!(declared_alignment(&mut Cursor::new(header(10, &u64::MAX.to_le_bytes()))), Some(u64::MAX.into()));
        // candle keeps the last of a repeated key, so the check reads the last.
        assert_eq!(declared_alignment(&mut Cursor::new(header_with(4, &32u32.to_le_bytes(), Some(0)))), Some(0));
    }

    #[test]
    fn zero_and_non_power_of_two_alignments_are_refused() {
        for bad in [0, 3, 48, -32, i128::from(u64::MAX)] {
            let e = check_alignment(Some(bad)).unwrap_err();
            assert!(e.contains(&format!("general.alignment is {bad}")) && e.contains("power of two"), "{e}");
        }
        for good in [None, Some(1), Some(32), Some(4096)] {
            check_alignment(good).unwrap();
        }
    }

    #[test]
    fn headers_it_cannot_follow_are_left_to_candle() {
        let mut truncated = header(4, &64u32.to_le_bytes());
        truncated.truncate(60);
        assert_eq!(declared_alignment(&mut Cursor::new(truncated)), None);
        assert_eq!(declared_alignment(&mut Cursor::new(b"not a gguf file".to_vec())), None);
        // A string-typed alignment is candle's to judge (it falls back to 32).
        assert_eq!(declared_alignment(&mut Cursor::new(header(8, &[0u8; 8]))), None);
    }
}
