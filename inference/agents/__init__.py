"""The agent integrations: plug-ins that gate and record GPT-Researcher, open_deep_research and any function,
and the read gate where retrieval pipelines filter documents (doc_gate.py; LangChain's compressor langchain.py,
LlamaIndex's postprocessor llamaindex.py)."""
