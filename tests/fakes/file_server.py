"""A file server speaking real HTTPS on 127.0.0.1, for files given by URL: its own CA
(made here with `cryptography`, written to a PEM file a test trusts through
AGENTLOOP_MEDIA_URL_CA_BUNDLE) signs a certificate for `localhost` and 127.0.0.1.

    with FileServer() as files:
        url = files.url("/files/boleta.jpg")      # https://localhost:<port>/files/…
        files.add("boleta.jpg", jpeg_bytes)

Paths: /files/<name> (the bytes, any Content-Type but the real one: the product
sniffs), /trickle (announces 100 KB, sends 10 bytes every 0.1 s), /endless (no length,
bytes until the client hangs up), /redirect/<name> (302 to what `redirect()` set).
Every request is recorded with its Host header and the name the client sent in SNI."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.fakes.server import FakeServer, TrackedHandler

CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentloop test CA")])


def _cert(key, issuer_key, *, ca: bool, names=()):
    """The CA's certificate (self-signed) or, signed by the CA, the server's for `names`."""
    now = datetime.datetime.now(datetime.UTC)
    subject = CA_NAME if ca else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(CA_NAME).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                                        critical=False)
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(the CA's PEM, the server's certificate, its key) written under `folder`."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert(ca_key, ca_key, ca=True)
    leaf = _cert(key, ca_key, ca=False,
                 names=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class Handler(TrackedHandler):
    server: FileServer

    def setup(self) -> None:
        self.request.do_handshake()  # here, in the request's thread (not in accept)
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.record(self.path, self.headers.get("Host", ""))
        kind, _, name = self.path.lstrip("/").partition("/")
        if kind == "files" and name in self.server.files:
            return self._answer(200, self.server.files[name])
        if kind == "redirect" and name in self.server.redirects:
            return self._answer(302, b"", {"Location": self.server.redirects[name]})
        if kind == "trickle":
            return self._trickle()
        if kind == "endless":
            return self._endless()
        return self._answer(404, b"not here")

    def _answer(self, status, body, headers=None):
        self.send_response(status)
        for name, value in {"Content-Type": "application/octet-stream", "Content-Length": str(len(body)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _trickle(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        while not self.server._stopping.is_set():
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            time.sleep(0.1)

    def _endless(self):
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for _ in range(1000):  # 64 MB at most, whoever listens
            self.wfile.write(b"y" * 65536)


class FileServer(FakeServer):
    def __init__(self, folder: Path | None = None):
        self._folder = tempfile.TemporaryDirectory() if folder is None else None
        where = Path(self._folder.name) if self._folder else folder
        self.ca_file, cert, key = make_certificates(where)
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(cert, key)
        self.sni: list[str] = []
        self.tls.sni_callback = lambda sock, name, ctx: self.sni.append(name or "")
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Host)

    def get_request(self):
        sock, address = super().get_request()
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def url(self, path: str, host: str = "localhost") -> str:
        return f"https://{host}:{self.server_address[1]}{path}"

    def add(self, name: str, data: bytes) -> str:
        self.files[name] = data
        return self.url(f"/files/{name}")

    def redirect(self, name: str, to: str) -> str:
        self.redirects[name] = to
        return self.url(f"/redirect/{name}")

    def record(self, path: str, host: str) -> None:
        with self._cond:
            self.requests.append((path, host))

    def stop(self) -> None:
        super().stop()
        if self._folder is not None:
            self._folder.cleanup()
