//! PostgreSQL log sequence numbers.

use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log, printed the way PostgreSQL prints it (`16/B374D848`).
///
/// ```
/// use outbox_relay::pg::Lsn;
/// let lsn: Lsn = "16/B374D848".parse().unwrap();
/// assert_eq!(lsn, Lsn(0x16_B374_D848));
/// assert_eq!(lsn.to_string(), "16/B374D848");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid / unset position `0/0`.
    pub const ZERO: Lsn = Lsn(0);

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text could not be read as an LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hexadecimal numbers separated by '/', like 16/B374D848")]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        if hi.is_empty() || lo.is_empty() || hi.len() > 8 || lo.len() > 8 {
            return Err(err());
        }
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        for (text, value) in [
            ("0/0", 0u64),
            ("16/B374D848", 0x16_B374_D848),
            ("FFFFFFFF/FFFFFFFF", u64::MAX),
        ] {
            assert_eq!(text.parse::<Lsn>().unwrap(), Lsn(value));
            assert_eq!(Lsn(value).to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in ["", "0", "/0", "0/", "G/0", "1/2/3", "123456789/0", " 0/0"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} should not parse");
        }
    }
}
