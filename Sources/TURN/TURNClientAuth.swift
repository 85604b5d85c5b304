import STUN

/// What a TURN client learnt from a server's 401 or 438 challenge: the realm
/// and nonce to echo, the password algorithm, and the long-term key
/// (RFC 8489 §9.2).
struct TURNClientAuth: Hashable, Sendable {
    var realm: String
    var nonce: String
    var algorithm: PasswordAlgorithm
    /// PASSWORD-ALGORITHMS exactly as offered, when the server negotiates
    /// algorithms (nonce cookie with the feature bit); echoed in every request.
    var offeredAlgorithms: [PasswordAlgorithm]?
    var key: IntegrityKey

    /// The RFC 8489 §9.2 nonce cookie: a server that starts its nonces with it
    /// announces its security features in the next four (base64) characters.
    static let nonceCookie = "obMatJos2"

    /// The algorithms this client can use, in no particular order: the
    /// server's preference (the order of its offer) decides.
    static let supported: [PasswordAlgorithm] = [.sha256, .md5]

    /// Whether the nonce carries the cookie with the "Password algorithms"
    /// feature bit. RFC 8489 §18.1 numbers the 24 feature bits from the most
    /// significant; erratum 6290 from the least significant. Either is
    /// accepted: both name the same bit in a 24-bit field only if the server
    /// sets the other reserved bit, which none does.
    static func offersPasswordAlgorithms(_ nonce: String) -> Bool {
        let bytes = Array(nonce.utf8)
        let cookie = Array(nonceCookie.utf8)
        guard bytes.count >= cookie.count + 4, bytes.starts(with: cookie) else { return false }
        var bits: UInt32 = 0
        for c in bytes[cookie.count..<(cookie.count + 4)] {
            guard let v = base64Value(c) else { return false }
            bits = bits << 6 | UInt32(v)
        }
        return bits & 0x80_0000 != 0 || bits & 0x1 != 0
    }

    private static func base64Value(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): c - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): c - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0") + 52
        case UInt8(ascii: "+"): 62
        case UInt8(ascii: "/"): 63
        default: nil
        }
    }

    /// Meets a 401 or 438 challenge: takes its REALM (a 438 may leave it out:
    /// the previous one stays) and NONCE, picks the password algorithm, and
    /// derives the key.
    static func meet(
        _ challenge: Message, previous: TURNClientAuth?, username: String, configuration: TURNClient.Configuration
    ) throws(TURNClientError) -> TURNClientAuth {
        guard case .nonce(let nonce)? = try? challenge.value(.nonce) else {
            throw .badResponse("\(challenge.type) without a usable NONCE")
        }
        let realm: String
        if case .realm(let r)? = try? challenge.value(.realm) {
            realm = r
        } else if let previous {
            realm = previous.realm
        } else {
            throw .badResponse("\(challenge.type) without a usable REALM")
        }
        if let expected = configuration.realm, expected != realm {
            throw .authenticationFailed("the server's realm is '\(realm)', expected '\(expected)'")
        }
        var algorithm = PasswordAlgorithm.md5
        var offered: [PasswordAlgorithm]?
        if offersPasswordAlgorithms(nonce) {
            // RFC 8489 §9.2.4: the cookie promises PASSWORD-ALGORITHMS; without
            // it the offer was stripped on the way (a bid-down attack).
            guard case .passwordAlgorithms(let list)? = try? challenge.value(.passwordAlgorithms), !list.isEmpty else {
                throw .authenticationFailed("the nonce announces password algorithms but the challenge offers none")
            }
            guard let chosen = list.first(where: { offer in supported.contains { $0.number == offer.number } }) else {
                throw .authenticationFailed("the server offers no password algorithm this client supports (MD5, SHA-256)")
            }
            algorithm = PasswordAlgorithm(number: chosen.number)
            offered = list
        }
        let key: IntegrityKey
        do {
            key = try IntegrityKey.longTerm(
                username: username, realm: realm, password: configuration.password, algorithm: algorithm)
        } catch {
            throw .authenticationFailed("cannot derive a key for realm '\(realm)': \(error.message)")
        }
        return TURNClientAuth(realm: realm, nonce: nonce, algorithm: algorithm, offeredAlgorithms: offered, key: key)
    }

    /// The attributes that authenticate a request (before MESSAGE-INTEGRITY).
    func attributes(username: String) -> [Attribute] {
        var out: [Attribute] = [.username(username), .realm(realm), .nonce(nonce)]
        if let offeredAlgorithms {
            out.append(.passwordAlgorithms(offeredAlgorithms))
            out.append(.passwordAlgorithm(algorithm))
        }
        return out
    }

    /// With a negotiated SHA-256 password the request carries
    /// MESSAGE-INTEGRITY-SHA256 too (after MESSAGE-INTEGRITY, so that a server
    /// checking either finds its own).
    var signsWithSHA256: Bool { offeredAlgorithms != nil && algorithm.number == PasswordAlgorithm.sha256.number }
}

extension Message {
    /// Whether a response is authenticated by `key`: MESSAGE-INTEGRITY-SHA256
    /// when present, else MESSAGE-INTEGRITY; a response with neither is not.
    func isAuthenticated(by key: IntegrityKey) -> Bool {
        if attribute(.messageIntegritySHA256) != nil { return checkMessageIntegritySHA256(key: key) == .valid }
        if attribute(.messageIntegrity) != nil { return checkMessageIntegrity(key: key) == .valid }
        return false
    }
}
