//! Authentication as a pure exchange: each backend message of the authentication phase
//! goes in, the reply (if any) comes out in a buffer. No I/O: the connection moves the
//! bytes. Methods: trust, cleartext password, md5, SCRAM-SHA-256 (without channel
//! binding); anything else is refused with what to change.
//!
//! ```text
//!  server                      Authenticator                    reply
//!  AuthenticationOk          ─▶ Done
//!  CleartextPassword         ─▶ Reply ─────────────────────────▶ password
//!  Md5Password(salt)         ─▶ Reply ─────────────────────────▶ "md5" + md5(md5(pw+user)+salt)
//!  Sasl([..SCRAM-SHA-256..]) ─▶ Reply ─────────────────────────▶ client-first
//!  SaslContinue(data)        ─▶ Reply ─────────────────────────▶ client-final
//!  SaslFinal(data)           ─▶ Wait  (server signature checked)
//!  ErrorResponse             ─▶ ServerError (the connection maps SQLSTATE 28xxx)
//! ```

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::{ErrorResponseBody, Message};
use postgres_protocol::message::frontend;

/// What the connection does after one message.
pub enum AuthStep {
    /// Authenticated.
    Done,
    /// Send what was written into the buffer, then read the next message.
    Reply,
    /// Read the next message; nothing to send.
    Wait,
    /// The server refused (ErrorResponse).
    ServerError(ErrorResponseBody),
}

/// Why authentication cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The user or the server's settings must change; the text says how.
    #[error("{0}")]
    Refused(String),
    /// The server broke the protocol.
    #[error("{0}")]
    Protocol(String),
}

/// One authentication exchange for `user`.
pub struct Authenticator<'a> {
    user: &'a str,
    password: Option<&'a [u8]>,
    scram: Option<ScramSha256>,
}

impl<'a> Authenticator<'a> {
    pub fn new(user: &'a str, password: Option<&'a [u8]>) -> Self {
        Authenticator {
            user,
            password,
            scram: None,
        }
    }

    fn password(&self) -> Result<&'a [u8], AuthError> {
        self.password.ok_or_else(|| {
            AuthError::Refused(
                "the server asks for a password but the postgres url has none; add it as postgres://user:password@host/db".into(),
            )
        })
    }

    /// Takes one backend message; writes any reply into `out`.
    pub fn on_message(
        &mut self,
        message: Message,
        out: &mut BytesMut,
    ) -> Result<AuthStep, AuthError> {
        let io = |e: std::io::Error| AuthError::Protocol(format!("cannot encode the reply: {e}"));
        match message {
            Message::AuthenticationOk => Ok(AuthStep::Done),
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(self.password()?, out).map_err(io)?;
                Ok(AuthStep::Reply)
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(self.user.as_bytes(), self.password()?, body.salt());
                frontend::password_message(hash.as_bytes(), out).map_err(io)?;
                Ok(AuthStep::Reply)
            }
            Message::AuthenticationSasl(body) => {
                let mut mechanisms = body.mechanisms();
                let mut offered = Vec::new();
                while let Some(mechanism) = mechanisms
                    .next()
                    .map_err(|e| AuthError::Protocol(format!("bad SASL mechanism list: {e}")))?
                {
                    offered.push(mechanism.to_owned());
                }
                if !offered.iter().any(|m| m == SCRAM_SHA_256) {
                    return Err(AuthError::Refused(format!(
                        "the server offers SASL mechanisms {offered:?}; only {SCRAM_SHA_256} is supported"
                    )));
                }
                let client = ScramSha256::new(self.password()?, ChannelBinding::unsupported());
                frontend::sasl_initial_response(SCRAM_SHA_256, client.message(), out)
                    .map_err(io)?;
                self.scram = Some(client);
                Ok(AuthStep::Reply)
            }
            Message::AuthenticationSaslContinue(body) => {
                let client = self
                    .scram
                    .as_mut()
                    .ok_or_else(|| AuthError::Protocol("SASL continue before SASL start".into()))?;
                client
                    .update(body.data())
                    .map_err(|e| AuthError::Refused(format!("SCRAM exchange failed: {e}")))?;
                frontend::sasl_response(client.message(), out).map_err(io)?;
                Ok(AuthStep::Reply)
            }
            Message::AuthenticationSaslFinal(body) => {
                let client = self
                    .scram
                    .as_mut()
                    .ok_or_else(|| AuthError::Protocol("SASL final before SASL start".into()))?;
                client.finish(body.data()).map_err(|e| {
                    AuthError::Refused(format!("the server's SCRAM signature did not verify: {e}"))
                })?;
                Ok(AuthStep::Wait)
            }
            Message::ErrorResponse(body) => Ok(AuthStep::ServerError(body)),
            Message::AuthenticationKerberosV5
            | Message::AuthenticationScmCredential
            | Message::AuthenticationGss
            | Message::AuthenticationSspi
            | Message::AuthenticationGssContinue(_) => Err(AuthError::Refused(
                "the server asks for an authentication method outside trust, password, md5 and scram-sha-256; change pg_hba.conf for this user".into(),
            )),
            _ => Err(AuthError::Protocol(
                "unexpected message during authentication".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `R` (authentication) message with `code` and `rest`, parsed as the server's.
    fn auth_message(code: u32, rest: &[u8]) -> Message {
        let mut bytes = vec![b'R'];
        bytes.extend_from_slice(&u32::try_from(8 + rest.len()).unwrap().to_be_bytes());
        bytes.extend_from_slice(&code.to_be_bytes());
        bytes.extend_from_slice(rest);
        Message::parse(&mut BytesMut::from(&bytes[..]))
            .unwrap()
            .expect("a complete message")
    }

    /// The body of a PasswordMessage (`p`, length, then the NUL-terminated password).
    fn password_reply(out: &BytesMut) -> &[u8] {
        assert_eq!(out[0], b'p');
        &out[5..out.len() - 1]
    }

    #[test]
    fn trust_needs_nothing() {
        let mut auth = Authenticator::new("relay", None);
        let mut out = BytesMut::new();
        assert!(matches!(
            auth.on_message(auth_message(0, &[]), &mut out),
            Ok(AuthStep::Done)
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn cleartext_and_md5_replies() {
        let mut out = BytesMut::new();
        let mut auth = Authenticator::new("relay", Some(b"secret"));
        assert!(matches!(
            auth.on_message(auth_message(3, &[]), &mut out),
            Ok(AuthStep::Reply)
        ));
        assert_eq!(password_reply(&out), b"secret");

        let mut out = BytesMut::new();
        assert!(matches!(
            auth.on_message(auth_message(5, &[1, 2, 3, 4]), &mut out),
            Ok(AuthStep::Reply)
        ));
        assert_eq!(
            password_reply(&out),
            md5_hash(b"relay", b"secret", [1, 2, 3, 4]).as_bytes()
        );
    }

    #[test]
    fn a_password_request_without_a_password_says_where_to_put_it() {
        let mut auth = Authenticator::new("relay", None);
        let err = auth
            .on_message(auth_message(3, &[]), &mut BytesMut::new())
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("postgres://user:password@"),
            "{err}"
        );
    }

    #[test]
    fn sasl_needs_scram_and_a_start() {
        let mut auth = Authenticator::new("relay", Some(b"pw"));
        let err = auth
            .on_message(auth_message(10, b"OTHER-MECH\0\0"), &mut BytesMut::new())
            .err()
            .expect("refused");
        assert!(err.to_string().contains("SCRAM-SHA-256"), "{err}");

        let mut out = BytesMut::new();
        assert!(matches!(
            auth.on_message(auth_message(10, b"SCRAM-SHA-256\0\0"), &mut out),
            Ok(AuthStep::Reply)
        ));
        assert_eq!(out[0], b'p', "SASLInitialResponse");

        let mut fresh = Authenticator::new("relay", Some(b"pw"));
        assert!(matches!(
            fresh.on_message(auth_message(11, b"r=x"), &mut BytesMut::new()),
            Err(AuthError::Protocol(_))
        ));
    }

    #[test]
    fn other_methods_are_refused_with_the_fix() {
        let mut auth = Authenticator::new("relay", Some(b"pw"));
        // GSSAPI.
        let err = auth
            .on_message(auth_message(7, &[]), &mut BytesMut::new())
            .err()
            .expect("refused");
        assert!(err.to_string().contains("pg_hba.conf"), "{err}");
    }
}
