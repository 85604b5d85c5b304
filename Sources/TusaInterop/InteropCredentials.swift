import STUN
import TURN

/// What the interop checker knows to verify MESSAGE-INTEGRITY with.
public struct InteropCredentials: Sendable {
    /// Long-term users: name → password (`--user U:P`).
    public var users: [String: String] = [:]
    /// A realm to use instead of the message's REALM (`--realm`).
    public var realm: String?
    /// REST-API shared secrets (`--secret`), for usernames `expiry[:user]`.
    public var secrets: [String] = []
    /// ICE short-term credentials: ufrag → password (`--ice UFRAG:PASSWORD`).
    public var ice: [String: String] = [:]

    public init() {}

    /// Parses `NAME:SECRET` (split at the first colon).
    public static func pair(_ text: String) -> (String, String)? {
        guard let colon = text.firstIndex(of: ":") else { return nil }
        let name = String(text[..<colon])
        let secret = String(text[text.index(after: colon)...])
        guard !name.isEmpty, !secret.isEmpty else { return nil }
        return (name, secret)
    }

    /// The candidate integrity keys for a request or indication, by what it
    /// carries: USERNAME with REALM (long-term, user or REST), USERHASH
    /// (long-term), or USERNAME alone (ICE short-term, keyed by the first ufrag).
    /// Each key comes with a label that names it in failure reasons.
    func keys(for m: Message) -> [(label: String, key: IntegrityKey)] {
        var out: [(String, IntegrityKey)] = []
        let algorithm: PasswordAlgorithm
        if case .passwordAlgorithm(let a)? = try? m.value(.passwordAlgorithm) { algorithm = a } else { algorithm = .md5 }
        var messageRealm: String?
        if case .realm(let r)? = try? m.value(.realm) { messageRealm = r }
        var username: String?
        if case .username(let u)? = try? m.value(.username) { username = u }
        let hasUserhash = m.attribute(.userhash) != nil
        // Long-term when the message names a realm (or carries USERHASH);
        // `--realm` only replaces the realm's value. Otherwise ICE short-term.
        let longTerm = messageRealm != nil || hasUserhash
        let realm = self.realm ?? messageRealm

        if longTerm, let realm {
            var candidates: [(String, String)] = []
            if let username {
                if let p = users[username] { candidates.append((username, p)) }
                if RESTCredentials.expiry(of: username) != nil {
                    for s in secrets { candidates.append((username, RESTCredentials.password(secret: s, username: username))) }
                }
            } else if case .userhash(let hash)? = try? m.value(.userhash) {
                for (u, p) in users.sorted(by: { $0.key < $1.key })
                where (try? IntegrityKey.userhash(username: u, realm: realm)) == hash {
                    candidates.append((u, p))
                }
            }
            for (u, p) in candidates {
                if let k = try? IntegrityKey.longTerm(username: u, realm: realm, password: p, algorithm: algorithm) {
                    out.append(("long-term user '\(u)'", k))
                }
            }
        } else if let username {
            let ufrag = String(username.split(separator: ":", maxSplits: 1).first ?? "")
            if let p = ice[ufrag], let k = try? IntegrityKey.shortTerm(password: p) {
                out.append(("ICE ufrag '\(ufrag)'", k))
            } else if let p = users[username], let k = try? IntegrityKey.shortTerm(password: p) {
                out.append(("short-term user '\(username)'", k))
            }
        }
        return out
    }

    /// Keys to try on a response whose request is not in the file: every ICE
    /// and user password as a short-term key, and with ``realm`` every user's
    /// long-term key.
    func fallbackKeys() -> [(label: String, key: IntegrityKey)] {
        var out: [(String, IntegrityKey)] = []
        for (ufrag, p) in ice.sorted(by: { $0.key < $1.key }) {
            if let k = try? IntegrityKey.shortTerm(password: p) { out.append(("ICE ufrag '\(ufrag)'", k)) }
        }
        for (u, p) in users.sorted(by: { $0.key < $1.key }) {
            if let k = try? IntegrityKey.shortTerm(password: p) { out.append(("short-term user '\(u)'", k)) }
            if let realm, let k = try? IntegrityKey.longTerm(username: u, realm: realm, password: p) {
                out.append(("long-term user '\(u)'", k))
            }
        }
        return out
    }
}
