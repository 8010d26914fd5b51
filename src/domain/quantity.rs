//! Kubernetes resource quantities ("10Gi", "1.5G", "1e9", "500M") ↔ bytes.

/// Bytes of a storage quantity, rounded up to a whole byte; `None` when it is
/// malformed, negative or beyond u64.
pub fn parse_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let digits_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(digits_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|c| c.is_ascii_digit())
        || !frac.bytes().all(|c| c.is_ascii_digit())
        || frac.len() > 18
    {
        return None;
    }
    // value = mantissa / 10^scale * numerator / denominator
    let mantissa: u128 = format!("{int}{frac}").parse().ok()?;
    let mut denominator: u128 = 10u128.checked_pow(frac.len() as u32)?;
    let mut numerator: u128 = 1;
    match suffix {
        "" => {}
        "Ki" => numerator = 1 << 10,
        "Mi" => numerator = 1 << 20,
        "Gi" => numerator = 1 << 30,
        "Ti" => numerator = 1 << 40,
        "Pi" => numerator = 1 << 50,
        "Ei" => numerator = 1 << 60,
        "n" => denominator = denominator.checked_mul(1_000_000_000)?,
        "u" => denominator = denominator.checked_mul(1_000_000)?,
        "m" => denominator = denominator.checked_mul(1_000)?,
        "k" => numerator = 1_000,
        "M" => numerator = 1_000_000,
        "G" => numerator = 1_000_000_000,
        "T" => numerator = 1_000_000_000_000,
        "P" => numerator = 1_000_000_000_000_000,
        "E" => numerator = 1_000_000_000_000_000_000,
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().ok()?;
            let pow = 10u128.checked_pow(exp.unsigned_abs())?;
            if exp >= 0 {
                numerator = pow;
            } else {
                denominator = denominator.checked_mul(pow)?;
            }
        }
        _ => return None,
    }
    let value = mantissa.checked_mul(numerator)?.div_ceil(denominator);
    u64::try_from(value).ok()
}

/// A quantity string for a byte count: exact, in binary units when they fit.
pub fn format_bytes(bytes: u64) -> String {
    for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_suffix_kind() {
        let cases = [
            ("1Gi", 1u64 << 30),
            ("10Mi", 10 << 20),
            ("1073741824", 1 << 30),
            ("1G", 1_000_000_000),
            ("1.5Gi", 3 << 29),
            ("500M", 500_000_000),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("1500m", 2),
            ("0", 0),
            ("+2k", 2000),
            (".5Ki", 512),
        ];
        for (q, want) in cases {
            assert_eq!(parse_bytes(q), Some(want), "{q}");
        }
        for bad in ["", "Gi", "-1Gi", "1Xi", "1.2.3", "1e", "99999999Ei"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_exactly() {
        assert_eq!(format_bytes(1 << 30), "1Gi");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(4096), "4Ki");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        for n in [1u64 << 30, 12345, 3 << 29, 5 << 40] {
            assert_eq!(parse_bytes(&format_bytes(n)), Some(n));
        }
    }
}
