//! Kubernetes resource quantities (`100m`, `1.5`, `512Mi`, `1G`, `2e3`), exact in billionths.

/// A quantity in billionths (Kubernetes' nano scale), so that 100m CPU and 1Gi of memory add
/// exactly.
pub type Nanos = i128;
pub const NANO: i128 = 1_000_000_000;

/// How a quantity was written, which is how Kubernetes writes it back: Go's
/// `resource.Format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// No suffix, or n, u, m, k, M, G, T, P, E.
    DecimalSi,
    /// Ki, Mi, Gi, Ti, Pi, Ei.
    BinarySi,
    /// `e<n>` or `E<n>`.
    DecimalExponent,
}

/// `n * 10^exp`, rounded away from zero when `exp` drops digits (a quantity finer than a
/// billionth is rounded up to one, as Kubernetes parses).
fn shift10(digits: &str, exp: i32) -> Option<i128> {
    let digits = digits.trim_start_matches('0');
    if exp >= 0 {
        let n: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        return n.checked_mul(10i128.checked_pow(exp as u32)?);
    }
    let keep = digits.len().saturating_sub(exp.unsigned_abs() as usize);
    let (kept, dropped) = digits.split_at(keep);
    let n: i128 = if kept.is_empty() {
        0
    } else {
        kept.parse().ok()?
    };
    Some(n + i128::from(dropped.bytes().any(|b| b != b'0')))
}

/// A quantity in billionths and the format it was written in; None when it is not one.
pub fn parse_quantity_format(s: &str) -> Option<(Nanos, Format)> {
    let s = s.trim();
    let (negative, unsigned) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let split = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (num, suffix) = unsigned.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let frac = frac.trim_end_matches('0');
    let digits = format!("{int}{frac}");
    let scale = frac.len() as i32;
    // (power of ten, power of 1024, format)
    let (exp10, exp1024, format) = match suffix {
        "" => (0, 0, Format::DecimalSi),
        "n" => (-9, 0, Format::DecimalSi),
        "u" => (-6, 0, Format::DecimalSi),
        "m" => (-3, 0, Format::DecimalSi),
        "k" => (3, 0, Format::DecimalSi),
        "M" => (6, 0, Format::DecimalSi),
        "G" => (9, 0, Format::DecimalSi),
        "T" => (12, 0, Format::DecimalSi),
        "P" => (15, 0, Format::DecimalSi),
        "E" => (18, 0, Format::DecimalSi),
        "Ki" => (0, 1, Format::BinarySi),
        "Mi" => (0, 2, Format::BinarySi),
        "Gi" => (0, 3, Format::BinarySi),
        "Ti" => (0, 4, Format::BinarySi),
        "Pi" => (0, 5, Format::BinarySi),
        "Ei" => (0, 6, Format::BinarySi),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok()?;
            (exp, 0, Format::DecimalExponent)
        }
        _ => return None,
    };
    let nanos = if exp1024 == 0 {
        shift10(&digits, 9 + exp10.checked_sub(scale)?)?
    } else {
        // The digits times 1024^k first (exact), then the decimal point.
        let n: i128 = digits.trim_start_matches('0').parse().unwrap_or(0);
        let n = n.checked_mul(1i128 << (10 * exp1024))?;
        shift10(&n.to_string(), 9 - scale)?
    };
    // A binary quantity under one is written as a decimal one.
    let format = if format == Format::BinarySi && nanos < NANO {
        Format::DecimalSi
    } else {
        format
    };
    Some((if negative { -nanos } else { nanos }, format))
}

/// Why a string is not a quantity, in the words of Kubernetes' `resource.ParseQuantity`: its
/// shape is wrong, or its suffix is no suffix.
pub fn quantity_error(s: &str) -> &'static str {
    let s = s.trim();
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let split = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (num, suffix) = unsigned.split_at(split);
    let letters = suffix.trim_start_matches(|c| "eEinumkKMGTP".contains(c));
    let digits = letters.strip_prefix(['+', '-']).unwrap_or(letters);
    let shaped = !num.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    if shaped && num.matches('.').count() <= 1 && num != "." {
        "unable to parse quantity's suffix"
    } else {
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    }
}

pub fn parse_quantity(s: &str) -> Option<Nanos> {
    parse_quantity_format(s).map(|(n, _)| n)
}

/// `s` as Kubernetes writes a quantity back (Go's `Quantity.String()`): in its format, with
/// no fraction and the largest suffix that keeps it exact (`1000m` -> `1`, `0.5` -> `500m`,
/// `1024Mi` -> `1Gi`, `1.5Gi` -> `1536Mi`, `1500e0` -> `1500`); None when it is not a
/// quantity.
pub fn canonical_quantity(s: &str) -> Option<String> {
    let (n, format) = parse_quantity_format(s)?;
    Some(format_canonical(n, format))
}

pub fn format_canonical(n: Nanos, format: Format) -> String {
    if n == 0 {
        return "0".into();
    }
    if format == Format::BinarySi && n % NANO == 0 && n.abs() >= 1024 * NANO {
        let mut whole = n / NANO;
        let mut k = 0;
        while k < 6 && whole % 1024 == 0 {
            whole /= 1024;
            k += 1;
        }
        return format!("{whole}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][k]);
    }
    // The mantissa and the largest power of a thousand that keeps it whole.
    let (mut m, mut exp) = (n, -9);
    while exp < 18 && m % 1000 == 0 {
        m /= 1000;
        exp += 3;
    }
    let suffix = match format {
        Format::DecimalExponent if exp == 0 => String::new(),
        Format::DecimalExponent => format!("e{exp}"),
        _ => ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"][((exp + 9) / 3) as usize].into(),
    };
    format!("{m}{suffix}")
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
        let shape = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
        let suffix = "unable to parse quantity's suffix";
        for (bad, why) in [
            ("1.1.M", shape),
            ("1+1.0M", shape),
            ("0.1mi", suffix),
            ("0.1am", shape),
            ("aoeu", shape),
            (".5i", suffix),
            ("1i", suffix),
            ("-3.01e-", suffix),
            (".", shape),
            ("+-1", shape),
            ("1Xi", shape),
            ("lots", shape),
        ] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
            assert_eq!(quantity_error(bad), why, "{bad}");
        }
        assert_eq!(format_quantity(NANO / 2, false), "500m");
        assert_eq!(format_quantity(3 * NANO, false), "3");
        assert_eq!(format_quantity((5i128 << 30) * NANO, true), "5Gi");
        assert_eq!(format_quantity((384i128 << 20) * NANO, true), "384Mi");
    }

    /// Kubernetes' TestQuantityParse, TestQuantityString and TestQuantityParseEmit cases, as
    /// written back.
    #[test]
    fn canonical_forms() {
        for (input, want) in [
            ("0", "0"),
            ("0n", "0"),
            ("0Ki", "0"),
            ("0M", "0"),
            ("1", "1"),
            ("1Ki", "1Ki"),
            ("8Ki", "8Ki"),
            ("7Mi", "7Mi"),
            ("1024Mi", "1Gi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Gi", "512Mi"),
            ("300Mi", "300Mi"),
            ("307200Ki", "300Mi"),
            ("1025024Mi", "1001Gi"),
            ("1024Gi", "1Ti"),
            ("1025", "1025"),
            ("0.5Ki", "512"),
            ("2000", "2k"),
            ("1.953125Ki", "2000"),
            ("5n", "5n"),
            ("4u", "4u"),
            ("3m", "3m"),
            ("1000m", "1"),
            ("5000m", "5"),
            ("-1000m", "-1"),
            ("0.5", "500m"),
            ("1.5", "1500m"),
            ("1.08", "1080m"),
            ("1080000000n", "1080m"),
            ("1000u", "1m"),
            ("8k", "8k"),
            ("50k", "50k"),
            ("1000M", "1G"),
            ("0.001T", "1G"),
            ("300M", "300M"),
            ("1E", "1E"),
            ("12E", "12E"),
            ("100.035k", "100035"),
            ("10.035M", "10035k"),
            ("8.1k", "8100"),
            ("6.987654321G", "6987654321"),
            ("2.5P", "2500T"),
            ("0.0005k", "500m"),
            ("9.01", "9010m"),
            ("-9.01", "-9010m"),
            (".001", "1m"),
            (".0001k", "100m"),
            ("1.", "1"),
            ("1.G", "1G"),
            ("+1", "1"),
            ("1e3", "1e3"),
            ("1E6", "1e6"),
            ("1e9", "1e9"),
            (".001e12", "1e9"),
            ("1E-3", "1e-3"),
            ("0.001e0", "1e-3"),
            ("1000e-12", "1e-9"),
            ("80e-3", "80e-3"),
            ("300e6", "300e6"),
            ("1.2e3", "1200"),
            ("1.5e3", "1500"),
            ("0.5e0", "500e-3"),
            ("00", "0"),
            // Finer than a billionth: rounded up to one (away from zero).
            ("3.001n", "4n"),
            ("1.1E-9", "2e-9"),
            ("0.0000000001", "1n"),
            ("0.9n", "1n"),
            ("0.00000012345", "124n"),
            ("-0.9n", "-1n"),
            // Binary under one is decimal.
            (".001Ki", "1024m"),
            (".000001Ki", "1024u"),
            (".000000001Ki", "1024n"),
            (".000000000001Ki", "2n"),
            ("100.035Ki", "102435840m"),
            ("-.001Ki", "-1024m"),
        ] {
            assert_eq!(canonical_quantity(input).as_deref(), Some(want), "{input}");
        }
    }
}
