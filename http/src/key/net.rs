//! IP networks: [`IpNet`] (an address masked to a prefix, parsed from
//! `10.0.0.0/8`) and [`IpKey`], the compact key [`PeerIp`](super::PeerIp)
//! gives a request.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Reads an IPv4-mapped IPv6 address as the IPv4 address it maps.
#[inline]
pub(super) fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// A prefix longer than the address family has bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a prefix of {bits} bits is longer than the {max} the address has")]
pub struct PrefixError {
    pub(super) bits: u8,
    pub(super) max: u8,
}

/// An IP network: an address and a prefix length, such as `10.0.0.0/8` or
/// `2001:db8::/32` (a bare address is the network of that one address).
/// The address is kept masked to its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    address: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Returns the network of `prefix` bits that holds `address`
    /// (IPv4-mapped IPv6 addresses are IPv4, with the prefix counted in
    /// IPv4 bits).
    ///
    /// # Errors
    ///
    /// [`PrefixError`] for a prefix longer than the address.
    #[inline]
    pub fn new(address: IpAddr, prefix: u8) -> Result<Self, PrefixError> {
        let address = canonical(address);
        let max = match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > max {
            return Err(PrefixError { bits: prefix, max });
        }
        Ok(Self {
            address: mask(address, prefix),
            prefix,
        })
    }

    /// Returns the network's first address.
    #[must_use]
    pub const fn address(&self) -> IpAddr {
        self.address
    }

    /// Returns the prefix length in bits.
    #[must_use]
    pub const fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Returns whether `address` is in this network.
    #[must_use]
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        address.is_ipv4() == self.address.is_ipv4() && mask(address, self.prefix) == self.address
    }
}

/// Clears every bit of `address` past the first `prefix`.
#[inline]
fn mask(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(mask_v4(v4, prefix))),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(mask_v6(v6, prefix))),
    }
}

/// The bits of `v4`'s first `prefix` (at most 32), the others cleared.
#[inline]
fn mask_v4(v4: Ipv4Addr, prefix: u8) -> u32 {
    u32::from(v4) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// The bits of `v6`'s first `prefix` (at most 128), the others cleared.
#[inline]
fn mask_v6(v6: Ipv6Addr, prefix: u8) -> u128 {
    u128::from(v6) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Why a string is not an [`IpNet`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an IP network (address/prefix): {0:?}")]
pub struct IpNetError(String);

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(text: &str) -> Result<Self, IpNetError> {
        let invalid = || IpNetError(text.to_owned());
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => {
                // Digits only: `u8::from_str` would take a leading `+`.
                if prefix.is_empty() || !prefix.bytes().all(|byte| byte.is_ascii_digit()) {
                    return Err(invalid());
                }
                (address, Some(prefix.parse::<u8>().map_err(|_| invalid())?))
            }
            None => (text, None),
        };
        let address = canonical(address.parse::<IpAddr>().map_err(|_| invalid())?);
        let prefix = prefix.unwrap_or(if address.is_ipv4() { 32 } else { 128 });
        Self::new(address, prefix).map_err(|_| invalid())
    }
}

/// The key [`PeerIp`](crate::PeerIp) gives a request: the client's
/// network, as bytes (`AsRef<[u8]>`, for a backend that keys by bytes) and
/// as text (`Display`: `198.51.100.7/32`, `2001:db8:1:2::/64`).
///
/// Owned and fixed in size: 19 bytes inline (at most 18 of them
/// meaningful), no allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpKey {
    /// The family (4 or 6), the prefix, then the masked address's bytes.
    bytes: [u8; 18],
    len: u8,
}

impl IpKey {
    /// The key of the network of `prefix` bits (at most 32) that holds
    /// `v4`.
    #[inline]
    pub(super) fn v4(v4: Ipv4Addr, prefix: u8) -> Self {
        let mut bytes = [0; 18];
        bytes[0] = 4;
        bytes[1] = prefix;
        bytes[2..6].copy_from_slice(&mask_v4(v4, prefix).to_be_bytes());
        Self { bytes, len: 6 }
    }

    /// The key of the network of `prefix` bits (at most 128) that holds
    /// `v6`.
    #[inline]
    pub(super) fn v6(v6: Ipv6Addr, prefix: u8) -> Self {
        let mut bytes = [0; 18];
        bytes[0] = 6;
        bytes[1] = prefix;
        bytes[2..18].copy_from_slice(&mask_v6(v6, prefix).to_be_bytes());
        Self { bytes, len: 18 }
    }

    /// Returns the network.
    #[must_use]
    pub fn net(&self) -> IpNet {
        let address = if self.bytes[0] == 4 {
            IpAddr::V4(Ipv4Addr::new(
                self.bytes[2],
                self.bytes[3],
                self.bytes[4],
                self.bytes[5],
            ))
        } else {
            let mut octets = [0; 16];
            octets.copy_from_slice(&self.bytes[2..18]);
            IpAddr::V6(Ipv6Addr::from(octets))
        };
        IpNet {
            address,
            prefix: self.bytes[1],
        }
    }
}

/// Hashes the meaningful bytes in one write: a keyed check hashes the key
/// on every request (`SipHash` by default), and one call costs less than
/// the derived array's length prefix and bytes.
impl std::hash::Hash for IpKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_ref());
    }
}

impl AsRef<[u8]> for IpKey {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Display for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.net(), f)
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::IpNet;

    #[test]
    fn networks_parse_mask_and_contain() {
        let net: IpNet = "10.1.2.3/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains("10.255.0.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(net.contains("::ffff:10.9.9.9".parse().unwrap()));
        let v6: IpNet = "2001:db8:1:2:3:4:5:6/64".parse().unwrap();
        assert_eq!(v6.to_string(), "2001:db8:1:2::/64");
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        let everything: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(everything.contains("203.0.113.9".parse().unwrap()));
        assert!(!everything.contains("::1".parse().unwrap()));
        assert_eq!("192.0.2.1".parse::<IpNet>().unwrap().prefix(), 32);
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "ten/8",
            "",
            "10.0.0.0/8/8",
        ] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad:?}");
        }
    }
}
