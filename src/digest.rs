//! Lower-case hex of digests: a leaf every layer may use (ETags, md5 hashes, signatures).

/// Lower-case hex of a digest.
pub fn hex_digest(d: impl AsRef<[u8]>) -> String {
    let d = d.as_ref();
    let mut s = String::with_capacity(d.len() * 2);
    write_hex(&mut s, d).expect("a String takes any text");
    s
}

/// Lower-case hex of `d` written into `out`, 64 bytes at a time (a digest in one piece).
pub fn write_hex(out: &mut impl std::fmt::Write, d: &[u8]) -> std::fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 128];
    for chunk in d.chunks(64) {
        for (i, b) in chunk.iter().enumerate() {
            buf[2 * i] = HEX[(b >> 4) as usize];
            buf[2 * i + 1] = HEX[(b & 15) as usize];
        }
        out.write_str(std::str::from_utf8(&buf[..2 * chunk.len()]).expect("hex is ASCII"))?;
    }
    Ok(())
}

/// 32 hex digits of 16 bytes from the OS random source (tokens, challenges, per-build ETags).
pub fn random_hex() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(hex_digest(b))
}

/// The md5 of some bytes as ResourceSync writes it (lower-case hex, without `md5:`).
pub fn md5_hex(data: &[u8]) -> String {
    use md5::{Digest, Md5};
    hex_digest(Md5::digest(data))
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_answers() {
        assert_eq!(super::hex_digest([0x00, 0xab, 0x7f]), "00ab7f");
        assert_eq!(super::md5_hex(b"a"), "0cc175b9c0f1b6a831c399e269772661");
    }
}
