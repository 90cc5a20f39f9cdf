//! Kubernetes resource quantities (`100m`, `1.5`, `512Mi`, `1G`, `2e3`), exact in billionths.

/// A quantity in billionths (Kubernetes' nano scale), so that 100m CPU and 1Gi of memory add
/// exactly.
pub type Nanos = i128;
pub const NANO: i128 = 1_000_000_000;

pub fn parse_quantity(s: &str) -> Option<Nanos> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, NANO),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok()?;
            if exp >= 0 {
                (10i128.checked_pow(exp as u32)?, 1)
            } else {
                (1, 10i128.checked_pow((-exp) as u32)?)
            }
        }
        _ => return None,
    };
    let negative = num.starts_with('-');
    let num = num.trim_start_matches(['+', '-']);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let int: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_digits = frac.len().min(18) as u32;
    let frac_val: i128 = if frac.is_empty() {
        0
    } else {
        frac[..frac_digits as usize].parse().ok()?
    };
    let scale = 10i128.pow(frac_digits);
    let whole = (int * scale + frac_val)
        .checked_mul(NANO)?
        .checked_mul(mul)?
        / scale
        / div;
    Some(if negative { -whole } else { whole })
}

/// A quantity back in Kubernetes' notation: `500m`, `2`, `512Mi`, `1Gi`.
pub fn format_quantity(n: Nanos, binary: bool) -> String {
    if n % NANO != 0 {
        if n % 1_000_000 == 0 {
            return format!("{}m", n / 1_000_000);
        }
        return format!("{n}n");
    }
    let whole = n / NANO;
    if binary && whole != 0 {
        for (suffix, shift) in [
            ("Ei", 60),
            ("Pi", 50),
            ("Ti", 40),
            ("Gi", 30),
            ("Mi", 20),
            ("Ki", 10),
        ] {
            if whole % (1i128 << shift) == 0 {
                return format!("{}{suffix}", whole >> shift);
            }
        }
    }
    whole.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for (s, n) in [
            ("1", NANO),
            ("500m", NANO / 2),
            ("1.5", 3 * NANO / 2),
            ("1Gi", (1i128 << 30) * NANO),
            ("128Mi", (128i128 << 20) * NANO),
            ("1k", 1000 * NANO),
            ("1e3", 1000 * NANO),
            ("0.1", NANO / 10),
        ] {
            assert_eq!(parse_quantity(s), Some(n), "{s}");
        }
        assert_eq!(parse_quantity("abc"), None);
        assert_eq!(parse_quantity("1Xi"), None);
        assert_eq!(format_quantity(NANO / 2, false), "500m");
        assert_eq!(format_quantity(3 * NANO, false), "3");
        assert_eq!(format_quantity((5i128 << 30) * NANO, true), "5Gi");
        assert_eq!(format_quantity((384i128 << 20) * NANO, true), "384Mi");
    }
}
