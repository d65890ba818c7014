//! Parsing a libpq connection URI into [`ConnectParams`]: the user info, one or more
//! hosts and ports, the database, and the query parameters the relay supports
//! (`sslmode` and the TLS files, `target_session_attrs`, `connect_timeout`, ...), each
//! refused with a reason when it cannot be honoured. Apart from the parameters' types in
//! `url.rs`, which every connection uses, because only the parser reads the URL's text,
//! and its errors must never echo the password in it.

use std::path::PathBuf;

use super::{
    ConnectParams, Secret, TargetSession, UrlOrigin, DEFAULT_CONNECT_TIMEOUT_SECS, DEFAULT_PORT,
};
use crate::pg::tls::{RootCert, SslMode, TlsParams};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid postgres url: {0} (expected postgres://user:password@host:port/dbname)")]
pub struct UrlError(String);

impl UrlError {
    /// The error of a decoded part, saying which part (its text is not shown: it may
    /// be a password).
    fn within(self, part: &str) -> Self {
        match self.0.split_once(" (") {
            Some((what, why)) => UrlError(format!("{what} in {part} ({why}")),
            None => UrlError(format!("{} in {part}", self.0)),
        }
    }
}

impl ConnectParams {
    /// Parse a libpq URI. Percent-encoded user, password and database names are decoded.
    pub fn from_url(url: &str) -> Result<Self, UrlError> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| UrlError("it must start with postgres:// or postgresql://".into()))?;
        // A '/' or '?' in the password ends the host part early; the rest of the user
        // info would then be read (and echoed) as a port, database or parameter.
        let (_, after) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
        if after.split('=').next().is_some_and(|a| a.contains('@')) {
            return Err(UrlError(
                "an '@' after the host part: percent-encode the user name and password ('/' as %2F, '?' as %3F, '@' as %40, '%' as %25), and an '@' in the database name as %40 (the URL is not shown: it may hold a password)".into(),
            ));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(info) => match info.split_once(':') {
                Some((u, p)) => (
                    decode(u).map_err(|e| e.within("the user name"))?,
                    Some(Secret(decode(p).map_err(|e| e.within("the password"))?)),
                ),
                None => (decode(info).map_err(|e| e.within("the user name"))?, None),
            },
            None => (String::new(), None),
        };
        let mut hosts = Vec::new();
        for one in hostport.split(',') {
            let (host, port) = split_host_port(one)?;
            hosts.push((
                if host.is_empty() {
                    "localhost".into()
                } else {
                    host
                },
                port,
            ));
        }
        let (host, port) = hosts.remove(0);
        let mut params = ConnectParams {
            host,
            port,
            fallback_hosts: hosts,
            target_session: TargetSession::Any,
            user,
            password,
            dbname: decode(path)?,
            application_name: "outbox-relay".into(),
            connect_timeout_secs: DEFAULT_CONNECT_TIMEOUT_SECS,
            tls: TlsParams::default(),
            origin: UrlOrigin::Config,
        };
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| UrlError(format!("parameter {pair:?} has no '='")))?;
            let value = decode(value).map_err(|e| e.within(&format!("parameter {key}")))?;
            match key {
                "user" => params.user = value,
                "password" => params.password = Some(Secret(value)),
                "dbname" => params.dbname = value,
                "host" => {
                    let mut hosts = value.split(',').map(str::to_owned);
                    params.host = hosts.next().unwrap_or_default();
                    params.fallback_hosts = hosts.map(|h| (h, params.port)).collect();
                }
                "port" => {
                    let ports = value
                        .split(',')
                        .map(parse_port)
                        .collect::<Result<Vec<u16>, UrlError>>()?;
                    let count = 1 + params.fallback_hosts.len();
                    if ports.len() != 1 && ports.len() != count {
                        return Err(UrlError(format!(
                            "{} ports for {count} hosts: give one port for all, or one per host",
                            ports.len()
                        )));
                    }
                    params.port = ports[0];
                    for (index, host) in params.fallback_hosts.iter_mut().enumerate() {
                        host.1 = *ports.get(index + 1).unwrap_or(&ports[0]);
                    }
                }
                "target_session_attrs" => {
                    params.target_session = match value.as_str() {
                        "any" => TargetSession::Any,
                        "read-write" | "primary" => TargetSession::ReadWrite,
                        other => {
                            return Err(UrlError(format!(
                                "target_session_attrs={other} is not supported: the relay needs the primary; use read-write (or primary), or any"
                            )))
                        }
                    }
                }
                "application_name" => params.application_name = value,
                "connect_timeout" => {
                    params.connect_timeout_secs = value.parse().map_err(|_| {
                        UrlError(format!("connect_timeout {value:?} is not a number of seconds"))
                    })?
                }
                "sslmode" => {
                    params.tls.mode = SslMode::parse(&value).ok_or_else(|| {
                        UrlError(format!(
                            "sslmode={value} is not a valid value: use disable, allow, prefer, require, verify-ca or verify-full"
                        ))
                    })?
                }
                "sslrootcert" => {
                    params.tls.root_cert = Some(match value.as_str() {
                        "system" => RootCert::System,
                        _ => RootCert::File(non_empty_path(key, value)?),
                    })
                }
                "sslcert" => params.tls.cert = Some(non_empty_path(key, value)?),
                "sslkey" => params.tls.key = Some(non_empty_path(key, value)?),
                "sslpassword" => {
                    return Err(UrlError(
                        "sslpassword is not supported: store the client key decrypted, readable only by the relay's user (mode 0600)".into(),
                    ))
                }
                "sslnegotiation" if value == "postgres" => {}
                "sslnegotiation" => {
                    return Err(UrlError(format!(
                        "sslnegotiation={value} is not supported: only postgres (SSLRequest first, as every PostgreSQL version takes it)"
                    )))
                }
                // SCRAM channel binding is not implemented: `disable` and `prefer` (use it
                // when possible) both connect without it, as libpq built without it does.
                "channel_binding" if value == "disable" || value == "prefer" => {}
                "channel_binding" => {
                    return Err(UrlError(format!(
                        "channel_binding={value} is not supported: SCRAM channel binding is not implemented; use sslmode=verify-full to authenticate the server instead"
                    )))
                }
                other => {
                    return Err(UrlError(format!(
                        "unknown parameter {other:?}; supported: user, password, dbname, host, port, application_name, connect_timeout, target_session_attrs, sslmode, sslrootcert, sslcert, sslkey, sslnegotiation, channel_binding"
                    )))
                }
            }
        }
        params.tls.validate().map_err(|e| UrlError(e.to_string()))?;
        if params.user.is_empty() {
            return Err(UrlError("no user name given".into()));
        }
        if params.dbname.is_empty() {
            return Err(UrlError(
                "no database name given: logical replication needs one".into(),
            ));
        }
        Ok(params)
    }
}

fn non_empty_path(key: &str, value: String) -> Result<PathBuf, UrlError> {
    if value.is_empty() {
        return Err(UrlError(format!(
            "{key} is empty: give the path of a PEM file"
        )));
    }
    Ok(PathBuf::from(value))
}

fn split_host_port(hostport: &str) -> Result<(String, u16), UrlError> {
    if let Some(inner) = hostport.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| UrlError("unclosed '[' in IPv6 host".into()))?;
        let port = match after.strip_prefix(':') {
            Some(p) => parse_port(p)?,
            None if after.is_empty() => DEFAULT_PORT,
            None => return Err(UrlError(format!("unexpected {after:?} after IPv6 host"))),
        };
        return Ok((host.to_owned(), port));
    }
    match hostport.rsplit_once(':') {
        Some((host, port)) => Ok((decode(host)?, parse_port(port)?)),
        None => Ok((decode(hostport)?, DEFAULT_PORT)),
    }
}

fn parse_port(text: &str) -> Result<u16, UrlError> {
    match text.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(UrlError(format!(
            "port {text:?} is not a number from 1 to 65535"
        ))),
    }
}

fn decode(text: &str) -> Result<String, UrlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    UrlError(
                        "bad percent-escape (a '%' must be followed by two hexadecimal digits; write '%' itself as %25)".into(),
                    )
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError("percent-escapes that are not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_url() {
        let p = ConnectParams::from_url(
            "postgres://relay:s%40cret@db.example:6543/app?application_name=x",
        )
        .unwrap();
        assert_eq!(p.user, "relay");
        assert_eq!(p.password.as_ref().unwrap().expose(), "s@cret");
        assert_eq!(p.host, "db.example");
        assert_eq!(p.port, 6543);
        assert_eq!(p.dbname, "app");
        assert_eq!(p.application_name, "x");
        assert_eq!(p.redacted(), "postgres://relay:***@db.example:6543/app");
        assert!(!format!("{p:?}").contains("s@cret"));
    }

    #[test]
    fn defaults_and_ipv6() {
        let p = ConnectParams::from_url("postgresql://u@[::1]/d").unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.password.is_none()),
            ("::1", DEFAULT_PORT, true)
        );
        let p = ConnectParams::from_url("postgres://u@/d").unwrap();
        assert_eq!(p.host, "localhost");
    }

    #[test]
    fn several_hosts_and_the_session_to_target() {
        let p = ConnectParams::from_url(
            "postgres://u@h1:5432,h2:5433,[::1]/app?target_session_attrs=read-write",
        )
        .unwrap();
        let hosts: Vec<(&str, u16)> = p.hosts().collect();
        assert_eq!(hosts, [("h1", 5432), ("h2", 5433), ("::1", DEFAULT_PORT)]);
        assert_eq!(p.target_session, TargetSession::ReadWrite);
        assert_eq!(p.redacted(), "postgres://u@h1:5432,h2:5433,::1:5432/app");
        let p = ConnectParams::from_url("postgres://u@/app?host=a,b&port=7000,7001").unwrap();
        assert_eq!(p.hosts().collect::<Vec<_>>(), [("a", 7000), ("b", 7001)]);
        let p = ConnectParams::from_url("postgres://u@/app?host=a,b&port=7000").unwrap();
        assert_eq!(p.hosts().collect::<Vec<_>>(), [("a", 7000), ("b", 7000)]);
        assert_eq!(
            ConnectParams::from_url("postgres://u@h/app?target_session_attrs=primary")
                .unwrap()
                .target_session,
            TargetSession::ReadWrite
        );
        for (url, needle) in [
            (
                "postgres://u@/app?host=a,b&port=1,2,3",
                "3 ports for 2 hosts",
            ),
            (
                "postgres://u@h/app?target_session_attrs=standby",
                "needs the primary",
            ),
            ("postgres://u@h1,h2:x/app", "port"),
        ] {
            let err = ConnectParams::from_url(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn tls_parameters() {
        let p = ConnectParams::from_url("postgres://u@h/d").unwrap();
        assert_eq!(p.tls, TlsParams::default());
        assert_eq!(p.tls.mode, SslMode::Prefer, "libpq's default");
        let p = ConnectParams::from_url(
            "postgres://u@h/d?sslmode=verify-full&sslrootcert=/etc/ca%20bundle.pem&sslcert=/c.crt&sslkey=/c.key",
        )
        .unwrap();
        assert_eq!(
            p.tls,
            TlsParams {
                mode: SslMode::VerifyFull,
                root_cert: Some(RootCert::File("/etc/ca bundle.pem".into())),
                cert: Some("/c.crt".into()),
                key: Some("/c.key".into()),
            }
        );
        let p = ConnectParams::from_url(
            "postgres://u@h/d?sslrootcert=system&sslmode=verify-full&channel_binding=prefer",
        )
        .unwrap();
        assert_eq!(p.tls.root_cert, Some(RootCert::System));
    }

    #[test]
    fn rejects_malformed_urls_with_reason() {
        for (url, needle) in [
            ("mysql://u@h/d", "must start with"),
            ("postgres://u@h:notaport/d", "port"),
            ("postgres://u@h:0/d", "port"),
            ("postgres://h:5432/d", "no user"),
            ("postgres://u@h:5432", "no database"),
            (
                "postgres://u@h/d?sslmode=verify_full",
                "sslmode=verify_full is not a valid",
            ),
            (
                "postgres://u@h/d?sslmode=require&sslrootcert=system",
                "verify-full",
            ),
            ("postgres://u@h/d?sslrootcert=", "sslrootcert is empty"),
            (
                "postgres://u@h/d?sslpassword=x",
                "sslpassword is not supported",
            ),
            (
                "postgres://u@h/d?channel_binding=require",
                "channel binding is not implemented",
            ),
            ("postgres://u@h/d?bogus=1", "unknown parameter"),
            ("postgres://u:%zz@h/d", "percent"),
        ] {
            let err = ConnectParams::from_url(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn errors_about_the_user_info_never_show_the_password() {
        for (url, needles) in [
            (
                "postgres://relay:Zq%zzSecret5@host/db",
                &["bad percent-escape in the password", "%25"][..],
            ),
            (
                "postgres://relay:Zq/Secret5@host/db",
                &["percent-encode the user name and password", "%2F"][..],
            ),
            (
                "postgres://relay:Zq?Secret5@host/db",
                &["percent-encode the user name and password", "%3F"][..],
            ),
            (
                "postgres://relay:Zq@x/Secret5@host/db",
                &["percent-encode the user name and password", "%40"][..],
            ),
            (
                "postgres://relay@host/db?password=Zq%zzSecret5",
                &["bad percent-escape in parameter password"][..],
            ),
            (
                "postgres://relay:Zq%ffSecret5@host/db",
                &["not UTF-8 in the password"][..],
            ),
        ] {
            let err = ConnectParams::from_url(url).unwrap_err().to_string();
            assert!(
                !err.contains("Zq") && !err.contains("Secret5"),
                "{url}: {err}"
            );
            for needle in needles {
                assert!(err.contains(needle), "{url}: {err}");
            }
        }
        // An '@' in a parameter's value is no user info.
        let p = ConnectParams::from_url("postgres://h/db?user=me@corp").unwrap();
        assert_eq!(p.user, "me@corp");
    }
}
