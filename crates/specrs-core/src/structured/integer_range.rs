//! Integers within bounds as a regex (JSON schema's `minimum` / `maximum` on integers): the
//! decimal spellings of every integer in `[lo, hi]` and no other, without leading zeros.
//!
//! A range of naturals is split by digit count; within one count, the first digit that
//! differs between the bounds splits it again into the low edge, a free middle and the high
//! edge, so the regex grows with the number of digits, not with the width of the range.

/// The regex of the integers in `[lo, hi]`; `None` leaves that side open. Empty where the
/// range is (`lo > hi`): the caller reports it.
pub fn integer_range_regex(lo: Option<i64>, hi: Option<i64>) -> Option<String> {
    if let (Some(lo), Some(hi)) = (lo, hi)
        && lo > hi
    {
        return None;
    }
    let mut parts = Vec::new();
    // Negative integers, as `-` and their magnitude.
    if lo.is_none_or(|lo| lo < 0) {
        let smallest_magnitude = match hi {
            Some(hi) if hi < 0 => hi.unsigned_abs(),
            _ => 1,
        };
        let largest_magnitude = lo.map(i64::unsigned_abs);
        parts.push(format!("-{}", natural_range(smallest_magnitude, largest_magnitude)));
    }
    // Non-negative ones.
    if hi.is_none_or(|hi| hi >= 0) {
        let from = lo.map_or(0, |lo| lo.max(0) as u64);
        parts.push(natural_range(from, hi.map(|hi| hi as u64)));
    }
    Some(format!("(?:{})", parts.join("|")))
}

/// The naturals in `[lo, hi]` (`hi` open where `None`).
fn natural_range(lo: u64, hi: Option<u64>) -> String {
    let lo_digits = digit_count(lo);
    // Open above: up to the largest number with `lo`'s digit count, then every longer one.
    let top = hi.unwrap_or_else(|| 10u64.saturating_pow(lo_digits as u32).saturating_sub(1));
    let mut parts: Vec<String> = (lo_digits..=digit_count(top))
        .map(|digits| {
            let from = if digits == lo_digits { lo } else { 10u64.pow(digits as u32 - 1) };
            let to = if digits == digit_count(top) { top } else { 10u64.pow(digits as u32) - 1 };
            same_length(&from.to_string(), &to.to_string())
        })
        .collect();
    if hi.is_none() {
        parts.push(format!("[1-9][0-9]{{{lo_digits},}}"));
    }
    format!("(?:{})", parts.join("|"))
}

fn digit_count(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// The numbers from `lo` to `hi`, both spelled with the same number of digits.
fn same_length(lo: &str, hi: &str) -> String {
    let (lo, hi) = (lo.as_bytes(), hi.as_bytes());
    let Some((&first_lo, rest_lo)) = lo.split_first() else { return String::new() };
    let (&first_hi, rest_hi) = hi.split_first().expect("the same length");
    let (first_lo, first_hi) = (first_lo as char, first_hi as char);
    if first_lo == first_hi {
        return format!("{first_lo}{}", same_length(as_str(rest_lo), as_str(rest_hi)));
    }
    let free = |n: usize| if n == 0 { String::new() } else { format!("[0-9]{{{n}}}") };
    let all = |rest: &[u8], digit: u8| rest.iter().all(|&d| d == digit);
    if all(rest_lo, b'0') && all(rest_hi, b'9') {
        return format!("[{first_lo}-{first_hi}]{}", free(rest_lo.len()));
    }
    let nines = "9".repeat(rest_lo.len());
    let zeros = "0".repeat(rest_hi.len());
    let mut parts = vec![format!("{first_lo}{}", same_length(as_str(rest_lo), &nines))];
    let (middle_lo, middle_hi) = ((first_lo as u8 + 1) as char, (first_hi as u8 - 1) as char);
    if middle_lo <= middle_hi {
        parts.push(format!("[{middle_lo}-{middle_hi}]{}", free(rest_lo.len())));
    }
    parts.push(format!("{first_hi}{}", same_length(&zeros, as_str(rest_hi))));
    format!("(?:{})", parts.join("|"))
}

fn as_str(digits: &[u8]) -> &str {
    std::str::from_utf8(digits).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    use super::super::regex_dfa::RegexGrammar;
    use super::*;

    /// The regex of `[lo, hi]` as a whole-text matcher.
    fn range(lo: Option<i64>, hi: Option<i64>) -> RegexGrammar {
        RegexGrammar::new(&integer_range_regex(lo, hi).unwrap()).unwrap()
    }

    fn members(lo: Option<i64>, hi: Option<i64>, probe: std::ops::RangeInclusive<i64>) -> Vec<i64> {
        let regex = range(lo, hi);
        probe.filter(|n| regex.matches(n.to_string().as_bytes())).collect()
    }

    #[test]
    fn every_integer_in_the_range_and_no_other_matches() {
        for (lo, hi) in
            [(0, 0), (0, 9), (3, 7), (5, 123), (17, 17), (10, 99), (99, 1000), (-12, 7), (-250, -3), (-9, 0)]
        {
            let want: Vec<i64> = (lo..=hi).collect();
            assert_eq!(members(Some(lo), Some(hi), -1100..=1100), want, "[{lo}, {hi}]");
        }
    }

    #[test]
    fn open_sides_run_to_every_digit_count() {
        assert_eq!(members(Some(95), None, -200..=200), (95..=200).collect::<Vec<_>>());
        assert_eq!(members(Some(-3), None, -200..=200), (-3..=200).collect::<Vec<_>>());
        assert_eq!(members(None, Some(-98), -200..=200), (-200..=-98).collect::<Vec<_>>());
        assert_eq!(members(None, Some(12), -200..=200), (-200..=12).collect::<Vec<_>>());
        assert!(range(Some(7), None).matches(b"123456789012"));
    }

    #[test]
    fn leading_zeros_and_minus_zero_never_match() {
        let regex = range(Some(-5), Some(50));
        for text in ["007", "00", "-0", "-05", "+5"] {
            assert!(!regex.matches(text.as_bytes()), "{text}");
        }
        assert_eq!(integer_range_regex(Some(3), Some(2)), None, "an empty range");
    }
}
