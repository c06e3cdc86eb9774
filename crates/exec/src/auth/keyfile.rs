//! A TSIG key in BIND's file form (`key "NAME" { algorithm ...; secret "..."; };`): what the
//! dealer writes, nsupdate reads with `-k`, named.conf includes, and the update
//! authentication's keys are read from.

use base64::Engine as _;

/// A TSIG key in BIND's format, usable as `nsupdate -k FILE` and includable in named.conf.
pub struct TsigKey {
    pub name: String,
    /// BIND's algorithm name, e.g. `hmac-sha256`.
    pub algorithm: String,
    pub secret_b64: String,
}

// The secret must not reach a log through a stray `{:?}`.
impl std::fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TsigKey").field("name", &self.name).field("algorithm", &self.algorithm).field("secret_b64", &"<redacted>").finish()
    }
}

impl TsigKey {
    pub fn generate(name: &str) -> std::io::Result<TsigKey> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| std::io::Error::other(format!("no OS randomness: {e}")))?;
        Ok(TsigKey { name: name.to_owned(), algorithm: "hmac-sha256".to_owned(), secret_b64: base64::engine::general_purpose::STANDARD.encode(secret) })
    }

    pub fn to_bind(&self) -> String {
        format!("key \"{}\" {{\n\talgorithm {};\n\tsecret \"{}\";\n}};\n", self.name, self.algorithm, self.secret_b64)
    }

    /// Reads back a key statement written by `to_bind` (named needs the name for its
    /// update-policy and the secret to check signatures).
    pub fn from_bind(text: &str) -> Result<TsigKey, String> {
        let quoted_after = |marker: &str| -> Option<String> {
            let start = text.find(marker)? + marker.len();
            let end = start + text[start..].find('"')?;
            Some(text[start..end].to_owned())
        };
        let name = quoted_after("key \"").ok_or("no `key \"NAME\"` statement")?;
        let secret_b64 = quoted_after("secret \"").ok_or("no `secret \"...\"`")?;
        base64::engine::general_purpose::STANDARD.decode(&secret_b64).map_err(|e| format!("secret is not base64: {e}"))?;
        // `algorithm NAME;` (tsig-keygen always writes it); hmac-sha256 when absent.
        let algorithm = text
            .find("algorithm")
            .map(|at| text[at + "algorithm".len()..].split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| "hmac-sha256".to_owned());
        if algorithm.chars().any(|c| !(c.is_ascii_alphanumeric() || c == '-')) {
            return Err(format!("algorithm {algorithm:?} is not a TSIG algorithm name"));
        }
        Ok(TsigKey { name, algorithm, secret_b64 })
    }

    pub fn secret(&self) -> Vec<u8> {
        // from_bind and generate only ever hold valid base64.
        base64::engine::general_purpose::STANDARD.decode(&self.secret_b64).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsig_key_round_trips() {
        let k = TsigKey::generate("sdns-update").unwrap();
        let back = TsigKey::from_bind(&k.to_bind()).unwrap();
        assert_eq!(back.name, "sdns-update");
        assert_eq!(back.algorithm, "hmac-sha256");
        let sha512 = TsigKey::from_bind("key \"k\" {\n\talgorithm hmac-sha512;\n\tsecret \"AAAA\";\n};\n").unwrap();
        assert_eq!(sha512.algorithm, "hmac-sha512");
        assert_eq!(back.secret(), k.secret());
        assert_eq!(k.secret().len(), 32);
        assert!(TsigKey::from_bind("secret \"AAAA\";").unwrap_err().contains("key"));
        assert!(TsigKey::from_bind("key \"k\" { };").unwrap_err().contains("secret"));
        assert!(TsigKey::from_bind("key \"k\" { secret \"**\"; };").unwrap_err().contains("base64"));
    }
}
