// swift-format-ignore: AlwaysUseLowerCamelCase
/// The handshake patterns offered (Noise rev 34, section 7), named as the
/// specification names them.
public enum NoisePattern: String, Sendable, CaseIterable {
    /// <- s … -> e, es, s, ss  <- e, ee, se  (the product's pattern)
    case IK
    /// <- s … -> e, es  <- e, ee
    case NK
    /// -> e  <- e, ee, s, es  -> s, se
    case XX
    /// IK with a pre-shared key mixed in at the end of message 2 (section 9).
    case IKpsk2

    enum Token { case e, s, ee, es, se, ss, psk }

    /// Whose static key is known before the handshake: (initiator's, responder's).
    var preMessages: (initiator: Bool, responder: Bool) {
        switch self {
        case .IK, .NK, .IKpsk2: (false, true)
        case .XX: (false, false)
        }
    }

    var messages: [[Token]] {
        switch self {
        case .IK: [[.e, .es, .s, .ss], [.e, .ee, .se]]
        case .NK: [[.e, .es], [.e, .ee]]
        case .XX: [[.e], [.e, .ee, .s, .es], [.s, .se]]
        case .IKpsk2: [[.e, .es, .s, .ss], [.e, .ee, .se, .psk]]
        }
    }

    var usesPSK: Bool { self == .IKpsk2 }

    /// Statics each side must bring: (local static needed, remote static needed).
    func requirements(initiator: Bool) -> (local: Bool, remote: Bool) {
        switch (self, initiator) {
        case (.IK, true), (.IKpsk2, true): (true, true)
        case (.IK, false), (.IKpsk2, false): (true, false)
        case (.NK, true): (false, true)
        case (.NK, false): (true, false)
        case (.XX, _): (true, false)
        }
    }
}

/// The two transport keys of a finished handshake, from this side's view.
public struct NoiseTransportKeys: Sendable {
    public let send: SecretKey
    public let receive: SecretKey

    public init(send: SecretKey, receive: SecretKey) {
        self.send = send
        self.receive = receive
    }
}

/// Noise HandshakeState (section 5.3) for `Noise_<pattern>_25519_ChaChaPoly_<hash>`.
///
/// Owned by one session; not Sendable. Any failure (a message that does not
/// authenticate, a bad length, a call out of turn) leaves the handshake
/// unusable: every later call throws `.handshakeState`. Secrets (ck, the
/// cipher key, DH outputs) are zeroed as they are spent, and all of them at
/// `split()` or on failure; the ephemeral private key is dropped then.
public final class NoiseHandshake {
    /// Noise's limit on any message.
    public static let maxMessageLength = 65535

    public let pattern: NoisePattern
    public let hash: NoiseHash
    public let isInitiator: Bool
    public var protocolName: String { "Noise_\(pattern.rawValue)_25519_ChaChaPoly_\(hash.name)" }

    private enum Phase {
        case running, complete, split
        case failed(String)
    }
    private var phase = Phase.running
    private var messageIndex = 0
    private let symmetric: NoiseSymmetricState
    private let localStatic: PrivateKey?
    private var localEphemeral: PrivateKey?
    private var presetEphemeral: PrivateKey?
    private let psk: SecretKey?
    public private(set) var remoteStaticKey: PublicKey?
    public private(set) var remoteEphemeralKey: PublicKey?

    /// - Parameters:
    ///   - localStatic: this side's static key, if the pattern sends or pre-shares one.
    ///   - remoteStatic: the peer's static key, for the initiator of IK/NK.
    ///   - localEphemeral: the ephemeral key to use (test vectors, or one drawn from the
    ///     caller's random source); when nil, a fresh one from libsodium.
    ///   - psk: the 32-byte pre-shared key, for IKpsk2 only.
    public init(
        pattern: NoisePattern, hash: NoiseHash = .blake2b, initiator: Bool, prologue: [UInt8],
        localStatic: PrivateKey?, remoteStatic: PublicKey?, localEphemeral: PrivateKey? = nil,
        psk: SecretKey? = nil
    ) throws {
        let needs = pattern.requirements(initiator: initiator)
        if needs.local && localStatic == nil {
            throw SecureError.handshakeState("\(pattern) \(initiator ? "initiator" : "responder") needs a local static key")
        }
        if needs.remote && remoteStatic == nil {
            throw SecureError.handshakeState("\(pattern) initiator needs the responder's static key")
        }
        if pattern.usesPSK != (psk != nil) {
            throw SecureError.handshakeState(pattern.usesPSK ? "\(pattern) needs a psk" : "\(pattern) takes no psk")
        }
        self.pattern = pattern
        self.hash = hash
        self.isInitiator = initiator
        self.localStatic = localStatic
        self.remoteStaticKey = needs.remote ? remoteStatic : nil
        self.presetEphemeral = localEphemeral
        self.psk = psk
        symmetric = NoiseSymmetricState(
            protocolName: "Noise_\(pattern.rawValue)_25519_ChaChaPoly_\(hash.name)", hash: hash)
        symmetric.mixHash(prologue)
        // Pre-messages: the responder's static (IK, NK), hashed by both sides.
        if pattern.preMessages.responder {
            let key = initiator ? remoteStatic : localStatic?.publicKey
            guard let key else { throw SecureError.handshakeState("missing pre-message key") }
            symmetric.mixHash(key.bytes)
        }
    }

    /// True once every handshake message has been written or read.
    public var isComplete: Bool {
        switch phase {
        case .complete, .split: true
        default: false
        }
    }

    /// h: the channel binding, equal on both sides once complete.
    public var handshakeHash: [UInt8] { symmetric.handshakeHash }

    /// Whether this side writes the next message.
    public var isMyTurn: Bool {
        guard case .running = phase else { return false }
        return (messageIndex % 2 == 0) == isInitiator
    }

    private func checkRunning(writing: Bool) throws {
        switch phase {
        case .running: break
        case .complete, .split: throw SecureError.handshakeState("handshake already complete")
        case .failed(let why): throw SecureError.handshakeState("handshake failed earlier: \(why)")
        }
        guard isMyTurn == writing else {
            throw fail(.handshakeState(writing ? "not this side's turn to write" : "not this side's turn to read"))
        }
    }

    private func fail(_ error: SecureError) -> SecureError {
        phase = .failed("\(error)")
        symmetric.clearSecrets()
        localEphemeral = nil
        presetEphemeral = nil
        return error
    }

    private func advance() {
        messageIndex += 1
        if messageIndex == pattern.messages.count {
            phase = .complete
            localEphemeral = nil
        }
    }

    /// The ephemeral key the next `e` token writes, drawn by the caller from its
    /// own random source (the responder draws it only once message 1 authenticated).
    func useEphemeral(_ key: PrivateKey) { presetEphemeral = key }

    /// WriteMessage: the next handshake message carrying `payload`.
    public func writeMessage(payload: [UInt8]) throws -> [UInt8] {
        try checkRunning(writing: true)
        do {
            var message: [UInt8] = []
            for token in pattern.messages[messageIndex] {
                switch token {
                case .e:
                    let e = presetEphemeral ?? PrivateKey.generate()
                    presetEphemeral = nil
                    localEphemeral = e
                    message.append(contentsOf: e.publicKey.bytes)
                    symmetric.mixHash(e.publicKey.bytes)
                    if pattern.usesPSK { e.publicKey.bytes.withUnsafeBytes { symmetric.mixKey($0) } }
                case .s:
                    guard let s = localStatic else { throw SecureError.handshakeState("no local static key") }
                    try symmetric.encryptAndHash(s.publicKey.bytes, appendingTo: &message)
                case .psk:
                    try mixPSK()
                case .ee, .es, .se, .ss:
                    try mixDH(token)
                }
            }
            try symmetric.encryptAndHash(payload, appendingTo: &message)
            guard message.count <= Self.maxMessageLength else {
                throw SecureError.malformed("handshake message longer than \(Self.maxMessageLength) bytes")
            }
            advance()
            return message
        } catch let error as SecureError {
            throw fail(error)
        }
    }

    /// ReadMessage: processes the peer's next message and returns its payload.
    public func readMessage(_ message: [UInt8]) throws -> [UInt8] {
        try checkRunning(writing: false)
        do {
            guard message.count <= Self.maxMessageLength else {
                throw SecureError.malformed("handshake message longer than \(Self.maxMessageLength) bytes")
            }
            var rest = message[...]
            for token in pattern.messages[messageIndex] {
                switch token {
                case .e:
                    guard rest.count >= PublicKey.length else { throw SecureError.truncated }
                    let re = PublicKey(unchecked: Array(rest.prefix(PublicKey.length)))
                    rest = rest.dropFirst(PublicKey.length)
                    remoteEphemeralKey = re
                    symmetric.mixHash(re.bytes)
                    if pattern.usesPSK { re.bytes.withUnsafeBytes { symmetric.mixKey($0) } }
                case .s:
                    let length = PublicKey.length + (symmetric.cipher.hasKey ? AEAD.tagLength : 0)
                    guard rest.count >= length else { throw SecureError.truncated }
                    let plain = try symmetric.decryptAndHash(rest.prefix(length))
                    rest = rest.dropFirst(length)
                    remoteStaticKey = PublicKey(unchecked: plain)
                case .psk:
                    try mixPSK()
                case .ee, .es, .se, .ss:
                    try mixDH(token)
                }
            }
            let payload = try symmetric.decryptAndHash(rest)
            advance()
            return payload
        } catch let error as SecureError {
            throw fail(error)
        }
    }

    private func mixPSK() throws {
        guard let psk else { throw SecureError.handshakeState("no psk") }
        psk.withUnsafeBytes { symmetric.mixKeyAndHash($0) }
    }

    /// ee, es, se, ss: the first letter is the initiator's key, the second
    /// the responder's; each side uses its private half and the peer's public.
    private func mixDH(_ token: NoisePattern.Token) throws {
        let (initiatorKey, responderKey): (Character, Character) =
            switch token {
            case .ee: ("e", "e")
            case .es: ("e", "s")
            case .se: ("s", "e")
            default: ("s", "s")
            }
        let mine = isInitiator ? initiatorKey : responderKey
        let theirs = isInitiator ? responderKey : initiatorKey
        guard let local = mine == "e" ? localEphemeral : localStatic,
            let remote = theirs == "e" ? remoteEphemeralKey : remoteStaticKey
        else { throw SecureError.handshakeState("missing key for \(token)") }
        try local.diffieHellman(with: remote, into: symmetric.dhScratch)
        symmetric.mixKeyWithDH()
    }

    /// Split(): the transport keys (initiator sends with k1, responder with
    /// k2). Once only, after the handshake completes; zeroes the chaining key.
    public func split() throws -> NoiseTransportKeys {
        switch phase {
        case .complete: break
        case .split: throw SecureError.handshakeState("split() already called")
        case .running: throw SecureError.handshakeState("handshake not complete")
        case .failed(let why): throw SecureError.handshakeState("handshake failed earlier: \(why)")
        }
        let (k1, k2) = symmetric.split()
        phase = .split
        return isInitiator ? NoiseTransportKeys(send: k1, receive: k2) : NoiseTransportKeys(send: k2, receive: k1)
    }
}
