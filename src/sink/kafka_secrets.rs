//! Which Kafka properties are secrets, and what of librdkafka's own texts may be
//! printed. One list of secret property names for every place that prints a property
//! (configuration errors, `check`, librdkafka's errors and log lines), and no
//! find-and-replace of secret values in finished text: a value equal to a word of the
//! text (a host, a topic, a user name) would blank that word out, and the pattern of
//! blanks would tell the value.

use std::borrow::Cow;

/// Property names whose values are secrets: passwords, secrets, tokens, private keys
/// (`ssl.key.*`, librdkafka's internal `ssl_key`), SASL configurations that carry
/// credentials. The one list: configuration errors, `check` and librdkafka's texts
/// ([`withhold_secret_detail`]) all ask it.
pub fn is_secret_property(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "credential",
        "jaas",
        "oauthbearer.config",
    ]
    .iter()
    .any(|word| key.contains(word))
        || key.starts_with("ssl.key.")
        || key == "ssl_key"
}

/// `text` (librdkafka's own words: an error, a log line) as it may be printed: whole
/// when it names no secret property ([`is_secret_property`]); when it does, only which
/// property it is about, since librdkafka quotes parts of such values in some texts
/// ("Unrecognized sasl.oauthbearer.config beginning at: ...", "Invalid value \"...\"
/// for configuration property ..."). Structural, by the property a text is about: a
/// secret's value is never searched for in the text, so a password that happens to
/// equal a word of it (a host, a topic) neither blanks that word out nor hints at the
/// password.
pub fn withhold_secret_detail(text: &str) -> Cow<'_, str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let secret = text
        .split(|c: char| !is_name(c))
        .map(|token| token.trim_matches('.'))
        .find(|token| (token.contains('.') || token.contains('_')) && is_secret_property(token));
    match secret {
        Some(property) => Cow::Owned(format!(
            "librdkafka reported a problem with {property} (its text is withheld: it may quote the secret)"
        )),
        None => Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_naming_no_secret_property_is_printed_whole() {
        // Whatever the password is ("broker", "127", "failed"), the text is not searched
        // for it: nothing is blanked out.
        let text = "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)";
        assert_eq!(withhold_secret_detail(text), text);
        let sasl = "sasl_ssl://broker:9093/1: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256";
        assert_eq!(withhold_secret_detail(sasl), sasl);
    }

    #[test]
    fn a_text_about_a_secret_property_names_only_the_property() {
        for (text, property) in [
            (
                "Unrecognized sasl.oauthbearer.config beginning at: principal=admin extension_token=s3cr3t",
                "sasl.oauthbearer.config",
            ),
            (
                "Invalid value \"s3cr3t\" for configuration property \"ssl.key.password\"",
                "ssl.key.password",
            ),
        ] {
            let shown = withhold_secret_detail(text);
            assert!(!shown.contains("s3cr3t"), "{shown}");
            assert!(shown.contains(property), "{shown}");
        }
    }

    #[test]
    fn the_secret_names_are_librdkafkas_sensitive_properties() {
        for key in [
            "sasl.password",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.client.secret",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.keystore.password",
            "ssl_key",
            "sasl.jaas.config",
        ] {
            assert!(is_secret_property(key), "{key}");
        }
        for key in [
            "sasl.username",
            "bootstrap.servers",
            "ssl.ca.location",
            "linger.ms",
        ] {
            assert!(!is_secret_property(key), "{key}");
        }
    }
}
