"""Hub names (models/formats/hub.py), offline: a Hugging Face cache laid out by hand as
huggingface_hub lays it out (models--org--name/{refs/<ref>, snapshots/<commit>/<file> ->
../../blobs/<hash>, blobs/}) in a temporary HF_HUB_CACHE, holding the tiny checkpoints of
tests/fixtures/hf. No test here reaches the network: HF_HUB_OFFLINE is set for every one."""

import hashlib
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

import models
from models.formats import hub
from models.formats.tokenizer import BPETokenizer

huggingface_hub = pytest.importorskip("huggingface_hub")

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
MAIN, V2 = "a" * 40, "b" * 40  # two commits of the same repository


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """An empty HF_HUB_CACHE, offline; a look-up of a host name fails the test."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(host, *args, **kwargs):
        pytest.fail(f"a test of the hub cache looked up {host}")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    return tmp_path / "hub"


@pytest.fixture
def calls(monkeypatch):
    """The keyword arguments of every snapshot_download call (which then runs as it would)."""
    seen, real = [], huggingface_hub.snapshot_download
    snapshot = lambda *args, **kwargs: seen.append(kwargs) or real(*args, **kwargs)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    return seen


def put(cache, repo_id, commit, source, refs=("main",)):
    """Cache every file of the directory `source` as the snapshot `commit` of repo_id: each file's
    bytes in blobs/ under its hash, a relative symlink to it in snapshots/<commit>/, and each ref
    in refs/ naming the commit (huggingface_hub's cache layout, docs: "Manage the cache")."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for file in sorted(Path(source).rglob("*")):
        if not file.is_file():
            continue
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        up = [".."] * (len(link.relative_to(repo).parts) - 1)  # snapshots/<commit>/.../file
        link.symlink_to(Path(*up, "blobs", blob.name))
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it


def same_weights(a, b):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(np.array_equal(pa[k].data, pb[k].data) for k in pa)


def test_the_hand_laid_cache_is_one_huggingface_hub_reads(cache):
    put(cache, "org/tiny", MAIN, HF / "qwen2")
    put(cache, "org/tiny", V2, HF / "llama", refs=("v2",))
    info = huggingface_hub.scan_cache_dir(cache)
    (repo,) = info.repos
    assert repo.repo_id == "org/tiny" and not info.warnings
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {MAIN: {"main"}, V2: {"v2"}}
    found = huggingface_hub.snapshot_download("org/tiny", cache_dir=cache, local_files_only=True)
    assert Path(found) == cache / "models--org--tiny" / "snapshots" / MAIN
    assert (Path(found) / "config.json").read_bytes() == (HF / "qwen2" / "config.json").read_bytes()


def test_a_hub_name_loads_the_model_and_its_tokenizer_from_the_cache(cache):
    put(cache, "org/tiny", MAIN, HF / "qwen2")
    model = models.from_pretrained("org/tiny", dtype=np.float64)
    assert same_weights(model, models.from_pretrained(HF / "qwen2", dtype=np.float64))
    tok = BPETokenizer.from_pretrained("org/tiny")
    text = "Hello, 世界! <|im_start|>"
    assert tok.encode(text) == BPETokenizer.from_pretrained(HF / "qwen2").encode(text)


def test_a_revision_picks_a_ref_or_a_commit(cache):
    put(cache, "org/tiny", MAIN, HF / "qwen2")
    put(cache, "org/tiny", V2, HF / "llama", refs=("v2",))
    llama = models.from_pretrained(HF / "llama")
    assert same_weights(models.from_pretrained("org/tiny", revision="v2"), llama)
    assert same_weights(models.from_pretrained("org/tiny", revision=V2), llama)
    qwen2 = models.from_pretrained(HF / "qwen2")
    assert same_weights(models.from_pretrained("org/tiny", revision=MAIN), qwen2)
    assert same_weights(models.from_pretrained("org/tiny"), qwen2)  # main
    tok = BPETokenizer.from_pretrained("org/tiny", revision="v2")
    assert tok.encode("Hi there") == BPETokenizer.from_pretrained(HF / "llama").encode("Hi there")


def test_a_name_the_cache_lacks_offline_says_so_and_how_to_get_it(cache, calls):
    with pytest.raises(hub.ModelNotFoundError) as caught:
        models.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
    # the cache only, asked for explicitly: huggingface_hub 0.x reads HF_HUB_OFFLINE at import
    assert [call["local_files_only"] for call in calls] == [True]
    message = str(caught.value)
    for part in ("HuggingFaceTB/SmolLM2-135M-Instruct", str(cache), "HF_HUB_OFFLINE is set",
                 "hf download HuggingFaceTB/SmolLM2-135M-Instruct`"):  # fmt: skip
        assert part in message
    assert isinstance(caught.value, FileNotFoundError)  # what the CLIs report as `error: ...`
    put(cache, "org/tiny", MAIN, HF / "qwen2")  # the repository, but not that revision
    with pytest.raises(hub.ModelNotFoundError, match=r"at revision 'v9'.*--revision v9"):
        BPETokenizer.from_pretrained("org/tiny", revision="v9")


def test_a_local_directory_wins_over_the_hub(cache, tmp_path, monkeypatch):
    put(cache, "org/tiny", MAIN, HF / "qwen2")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(HF / "llama", tmp_path / "org" / "tiny")
    assert same_weights(models.from_pretrained("org/tiny"), models.from_pretrained(HF / "llama"))
    local = BPETokenizer.from_pretrained(HF / "llama").encode("Hi there")
    assert BPETokenizer.from_pretrained("org/tiny").encode("Hi there") == local


def test_the_tokenizer_by_name_needs_only_the_tokenizer_files(cache):
    put(cache, "org/tok", MAIN, HF / "smollm2_tokenizer")  # no config.json, no weights
    tok = BPETokenizer.from_pretrained("org/tok")
    messages = [{"role": "user", "content": "Hi"}]
    local = BPETokenizer.from_pretrained(HF / "smollm2_tokenizer")
    assert tok.apply_chat_template(messages, add_generation_prompt=True) == (
        local.apply_chat_template(messages, add_generation_prompt=True)
    )


# A model repository as the hub has them: the safetensors beside the same weights in other
# formats (PyTorch pickles, GGUF, ONNX, TF, Flax, Mistral's consolidated copy), and the rest.
REPO_FILES = [
    ".gitattributes", "README.md", "config.json", "generation_config.json",
    "model.safetensors.index.json", "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors", "consolidated.safetensors", "params.json",
    "pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin",
    "SmolLM2-135M-Instruct.Q4_1.gguf", "onnx/model.onnx", "onnx/model.safetensors",
    "onnx/config.json", "tf_model.h5", "flax_model.msgpack", "original/consolidated.00.pth",
    "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.jinja",
    "special_tokens_map.json", "tokenizer.model", "runs/events.out.tfevents",
]  # fmt: skip
TOKENIZER = {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
             "chat_template.jinja", "special_tokens_map.json"}  # fmt: skip
WEIGHTS = {"config.json", "generation_config.json", "model.safetensors.index.json",
           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}  # fmt: skip


def test_only_the_files_glassgrad_reads_are_fetched(cache, calls):
    """The patterns each load passes to snapshot_download, applied to a repository's listing by
    huggingface_hub's own filter: no pickles, GGUF, ONNX or second copy of the weights."""
    from huggingface_hub.utils import filter_repo_objects

    def fetched(call, files=REPO_FILES):
        return set(filter_repo_objects(files, allow_patterns=call["allow_patterns"]))

    put(cache, "org/tiny", MAIN, HF / "qwen2")
    models.from_pretrained("org/tiny")
    BPETokenizer.from_pretrained("org/tiny")
    model, tokenizer = calls
    assert fetched(model) == WEIGHTS | TOKENIZER
    assert fetched(tokenizer) == TOKENIZER
    assert fetched(model, ["model.safetensors", "pytorch_model.bin"]) == {"model.safetensors"}


@pytest.mark.parametrize("name", ["org/tiny", "./org/tiny", "/no/such/org/tiny", "tiny", "a/b/c"])
def test_only_an_org_slash_name_goes_to_the_hub(name, monkeypatch):
    asked = []
    snapshot = lambda repo_id, **kwargs: asked.append(repo_id) or str(HF / "qwen2")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    try:
        models.from_pretrained(name)
    except FileNotFoundError:
        pass
    assert hub.is_repo_id(name) == (name == "org/tiny") == bool(asked)


def test_the_command_lines_take_a_hub_name_and_a_revision(cache, capsys):
    from models import sample

    put(cache, "org/tiny", MAIN, HF / "qwen2")
    put(cache, "org/tiny", V2, HF / "llama", refs=("v2",))
    args = [
        "--model",
        "org/tiny",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "3",
        "--temperature",
        "0",
    ]
    for revision, local in ((None, "qwen2"), ("v2", "llama")):
        assert sample.main(args + (["--revision", revision] if revision else [])) == 0
        assert sample.main([*args[2:], "--model", str(HF / local)]) == 0
        by_name, by_path = capsys.readouterr().out.splitlines()
        assert by_name == by_path


def test_a_path_that_is_no_hub_name_keeps_the_loaders_own_error():
    with pytest.raises(FileNotFoundError, match="does not exist") as caught:
        models.from_pretrained("no/such/directory")
    assert not isinstance(caught.value, hub.ModelNotFoundError)


def test_without_huggingface_hub_a_name_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(hub.ModelNotFoundError, match=r"pip install 'glassgrad\[hub\]'"):
        BPETokenizer.from_pretrained("org/tiny")
